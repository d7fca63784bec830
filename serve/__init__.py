"""strata-server: the OpenAI-compatible HTTP server that owns the FIFO and drives an engine process."""
