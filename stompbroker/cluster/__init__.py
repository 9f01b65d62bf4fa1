"""Cluster mode: several nodes sharing topics, queues and durable subscriptions through NATS JetStream
(see docs/cluster.md). Everything here but the bridge's parts is pure and imports no nats."""
