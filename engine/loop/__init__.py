"""The engine's loop: the protocol's I/O, admission, rounds, parking, the sequence's state; the mock
engine over a fake runner."""
