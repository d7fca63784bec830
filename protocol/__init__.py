"""The line protocol between strata-server and an engine process (see DESIGN.md)."""
