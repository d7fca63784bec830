"""The engine's loop: the protocol's I/O, the request table, admission, rounds, memory pressure,
parking, the sequence's state; the mock engine over a fake runner."""
