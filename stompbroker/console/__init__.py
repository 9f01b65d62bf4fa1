"""The web console, JSON API and Prometheus metrics served on the broker's own port."""
