"""The queue: requests' state, the scheduler's policy and its handling of engine lines, recovery,
routing between engines, what a request's run gives the routes, metrics."""
