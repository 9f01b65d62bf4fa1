"""Inter-process plumbing: the shared-memory ring, record formats and fd passing."""
