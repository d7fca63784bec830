"""The queue: requests' state, the scheduler's policy and its handling of engine lines, recovery,
routing between engines, metrics."""
