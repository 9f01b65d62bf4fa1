"""Broker core: routing, subscriptions and message selection."""
