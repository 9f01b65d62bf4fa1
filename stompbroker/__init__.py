"""stompbroker: a multi-process STOMP 1.0-1.2 broker over TCP and WebSocket."""

__version__ = "0.1.0"
