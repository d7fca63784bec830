"""The engine process: its launch, and the client that speaks the line protocol to it."""
