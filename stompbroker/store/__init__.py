"""Durable storage for queues (sqlite)."""
