"""STOMP protocol code (sans-IO)."""
