"""Diagnostics: DIAG queries and topics, /queue/monitor, latency histograms and statistics dumps."""
