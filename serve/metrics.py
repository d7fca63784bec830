"""Prometheus metrics (prometheus_client), one registry per app so tests can run several."""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160)


class Metrics:
    def __init__(self):
        r = self.registry = CollectorRegistry()
        self.requests = Counter("strata_requests", "Finished requests by finish reason", ["finish_reason"], registry=r)
        self.queue_wait = Histogram("strata_queue_wait_seconds", "Arrival to the first prompt chunk in the engine",
                                    buckets=LATENCY_BUCKETS, registry=r)
        self.ttft = Histogram("strata_ttft_seconds", "Arrival to the first generated token",
                              buckets=LATENCY_BUCKETS, registry=r)
        self.prompt_tokens = Counter("strata_prompt_tokens", "Prompt tokens read by the engine", registry=r)
        self.generated_tokens = Counter("strata_generated_tokens", "Tokens generated", registry=r)
        self.max_queue_wait_ms = Gauge("strata_max_queue_wait_ms", "Largest queue wait seen (ms)", registry=r)
        self.queued = Gauge("strata_queued_requests", "Requests waiting for the engine", registry=r)
        self.preemptions = Counter("strata_prefill_preemptions", "Prompt reads parked at a chunk boundary", registry=r)
        self.resumes = Counter("strata_prefill_resumes", "Parked reads resumed", registry=r)
        self.declined = Counter("strata_prefill_park_declined", "Boundary offers the engine declined, by gate",
                                ["reason"], registry=r)
        self.parked = Gauge("strata_parked_requests", "Requests parked in the engine", registry=r)
        self.running = Gauge("strata_running_requests", "Requests in the engine's slots, reading or decoding",
                             registry=r)
        self.slots = Gauge("strata_slots", "The engine's slots by state: reading, decoding, parked (a parked "
                           "read keeps its slot until a newcomer needs it) and free", ["state"], registry=r)
        self.reuse_lookups = Counter("strata_prompt_reuse_lookups", "Requests that looked for a kept conversation "
                                     "in the engine's slots", registry=r)
        self.reuse_hits = Counter("strata_prompt_reuse_hits", "Requests that found their prompt's start kept",
                                  registry=r)
        self.reused_tokens = Counter("strata_prompt_reused_tokens", "Prompt tokens not read again thanks to a "
                                     "kept conversation", registry=r)
        self.park_duration = Histogram("strata_park_duration_seconds", "Time from SUSPENDED to RESUME",
                                       buckets=LATENCY_BUCKETS, registry=r)
        self.engine_restarts = Counter("strata_engine_restarts", "Engine processes restarted after dying", registry=r)
        self.engine_death_requests = Counter(
            "strata_engine_death_requests", "Requests the engine held when it died, by outcome: recovered "
            "(answered in full after a restart) or failed (taken for the cause of repeated deaths)",
            ["outcome"], registry=r)
        self._max_wait = 0.0

    def watch_scheduler(self, scheduler) -> None:
        """The queue and park gauges are read from the scheduler's state at scrape time."""
        self.queued.set_function(lambda: len(scheduler.waiting))
        self.parked.set_function(lambda: len(scheduler.parked))
        self.running.set_function(lambda: len(scheduler.running))
        count = lambda reading: sum(r.reading == reading for r in scheduler.running)  # noqa: E731
        self.slots.labels("reading").set_function(lambda: count(True))
        self.slots.labels("decoding").set_function(lambda: count(False))
        in_slots = lambda: sum(r.slot is not None and r.slot >= 0 for r in scheduler.parked)  # noqa: E731
        self.slots.labels("parked").set_function(in_slots)  # the others are in host memory (INFO slot=-1)
        self.slots.labels("free").set_function(lambda: max(0, scheduler.slots - len(scheduler.running) - in_slots()))

    def observe_prompt_reuse(self, cached: int) -> None:
        self.reuse_lookups.inc()
        if cached:
            self.reuse_hits.inc()
            self.reused_tokens.inc(cached)

    def observe_queue_wait(self, seconds: float) -> None:
        self.queue_wait.observe(seconds)
        if seconds * 1000 > self._max_wait:
            self._max_wait = seconds * 1000
            self.max_queue_wait_ms.set(self._max_wait)

    def render(self) -> bytes:
        return generate_latest(self.registry)
