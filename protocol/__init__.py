"""The line protocol between strata-server and an engine process (see docs/DESIGN.md)."""
