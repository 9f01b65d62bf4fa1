"""The broker's processes: supervisor, reader, dispatcher, writers (thin loops around the pure parts)."""
