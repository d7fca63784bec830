"""Prometheus metrics (prometheus_client), one registry per app so tests can run several."""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import Metric

LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160)
INTAKE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)  # (a request's intake: ms)


REUSE_KEYS = ("lookups", "hits", "tokens_reused", "tokens_from_host")  # an engine's prefix-cache counts
EXPERT_KEYS = ("expert_hits", "expert_misses", "expert_bytes", "expert_tokens")  # an expert cache's (its pool report)


def reuse_summary(counts: dict) -> dict:
    """Prefix-cache counts (REUSE_KEYS) with their hit rate, as /status shows them."""
    lookups = counts["lookups"]
    return counts | {"hit_rate": round(counts["hits"] / lookups, 4) if lookups else None}


def expert_summary(pool: dict) -> dict:
    """An engine's pool report (its counts summed over engines) -> the same without the expert cache's raw counts,
    and with them as /status shows them under `expert_cache` (absent without a cache): slots, layers, hits,
    misses, hit rate, bytes copied, and bytes copied a token."""
    out = {k: v for k, v in pool.items() if not k.startswith("expert_")}
    if "expert_slots" not in pool:
        return out
    hits, misses, tokens = (pool.get(k, 0) for k in ("expert_hits", "expert_misses", "expert_tokens"))
    return out | {"expert_cache": {
        "slots": pool["expert_slots"], "layers": pool.get("expert_layers", 0), "hits": hits, "misses": misses,
        "hit_rate": round(hits / (hits + misses), 4) if hits + misses else None,
        "bytes_copied": pool.get("expert_bytes", 0), "tokens": tokens,
        "bytes_per_token": round(pool.get("expert_bytes", 0) / tokens) if tokens else None}}


def experts_together(pools: list[dict]) -> dict:
    """Several engines' pool reports' expert cache counts summed, as expert_summary shows them (empty without a
    cache)."""
    keys = {key for pool in pools for key in pool if key.startswith("expert_")}
    return expert_summary({key: sum(pool.get(key, 0) for pool in pools) for key in keys})


def load_counts(scheduler) -> tuple[int, int]:
    """(running, waiting) in the words routers and gateways use: a request paused for memory or a
    parked read waits, like a queued one."""
    paused = sum(r.paused for r in scheduler.running)
    return len(scheduler.running) - paused, len(scheduler.waiting) + len(scheduler.parked) + paused


class Metrics:
    def __init__(self):
        r = self.registry = CollectorRegistry()
        self.requests = Counter("strata_requests", "Finished requests by finish reason", ["finish_reason"], registry=r)
        self.queue_wait = Histogram("strata_queue_wait_seconds", "Arrival to the first prompt chunk in the engine",
                                    buckets=LATENCY_BUCKETS, registry=r)
        self.ttft = Histogram("strata_ttft_seconds", "Arrival to the first generated token",
                              buckets=LATENCY_BUCKETS, registry=r)
        self.intake = Histogram("strata_intake_seconds", "Arrival to the request's place in line (body parsed, "
                                "templated, tokenized)", buckets=INTAKE_BUCKETS, registry=r)
        self.prompt_tokens = Counter("strata_prompt_tokens", "Prompt tokens read by the engine", registry=r)
        self.generated_tokens = Counter("strata_generated_tokens", "Tokens generated", registry=r)
        self.max_queue_wait_ms = Gauge("strata_max_queue_wait_ms", "Largest queue wait seen (ms)", registry=r)
        self.queued = Gauge("strata_queued_requests", "Requests waiting for the engine", registry=r)
        self.preemptions = Counter("strata_prefill_preemptions", "Prompt reads parked at a chunk boundary", registry=r)
        self.resumes = Counter("strata_prefill_resumes", "Parked reads resumed", registry=r)
        self.declined = Counter("strata_prefill_park_declined", "Boundary offers the engine declined, by gate",
                                ["reason"], registry=r)
        self.parked = Gauge("strata_parked_requests", "Requests parked in the engine", registry=r)
        self.running = Gauge("strata_running_requests", "Requests in the engine by state: reading, decoding, "
                             "paused (moved to host memory for memory)", ["state"], registry=r)
        self.kv_blocks = Gauge("strata_kv_blocks", "The engine's KV pool in blocks: total, used (held by requests), "
                               "cached (prefix cache, held or not), free (never cached or evicted)", ["state"],
                               registry=r)
        self.kv_bytes_per_token = Gauge("strata_kv_bytes_per_token", "KV bytes one token holds (all layers)",
                                        registry=r)
        self.waiting_for_memory = Gauge("strata_waiting_for_memory", "1 while the engine has deferred a request "
                                        "for memory and none has ended since", registry=r)
        self.deferred = Counter("strata_deferred", "GEN or RESUME lines the engine deferred, by reason", ["reason"],
                                registry=r)
        self.spec_drafted = Counter("strata_spec_drafted_tokens", "Tokens drafted by speculative decoding",
                                    registry=r)
        self.spec_accepted = Counter("strata_spec_accepted_tokens", "Drafted tokens the model's own tokens "
                                     "confirmed (each one a decode step saved)", registry=r)
        self.reuse_lookups = Counter("strata_prompt_reuse_lookups", "Requests that looked in the prefix cache",
                                     registry=r)
        self.reuse_hits = Counter("strata_prompt_reuse_hits", "Requests that found their prompt's start cached",
                                  registry=r)
        self.reused_tokens = Counter("strata_prompt_reused_tokens", "Prompt tokens not read again thanks to the "
                                     "prefix cache", registry=r)
        self.host_reused_tokens = Counter("strata_prompt_reused_from_host_tokens", "Of those, tokens whose rows "
                                          "were copied back from the host tier (--cache-ram)", registry=r)
        self.host_blocks = Gauge("strata_kv_host_blocks", "The host tier of evicted prefix blocks (--cache-ram): "
                                 "held, capacity", ["state"], registry=r)
        self.expert_hits = Counter("strata_expert_cache_hits", "Routed experts a step found in the GPU's expert "
                                   "cache (once a step and layer each; --expert-slots, --gpu-memory)", registry=r)
        self.expert_misses = Counter("strata_expert_cache_misses", "Routed experts a step read from host memory "
                                     "(over the link in a decode step, copied in for a prompt chunk)", registry=r)
        self.expert_bytes = Counter("strata_expert_cache_copied_bytes", "Bytes copied into the expert cache",
                                    registry=r)
        self.expert_tokens = Counter("strata_expert_cache_tokens", "Tokens routed through the expert cache "
                                     "(copied bytes / tokens: what a token costs the host link)", registry=r)
        self.expert_slots = Gauge("strata_expert_cache_slots", "The expert cache's slots, all layers together "
                                  "(0: every expert resident)", registry=r)
        self.park_duration = Histogram("strata_park_duration_seconds", "Time from SUSPENDED to RESUME",
                                       buckets=LATENCY_BUCKETS, registry=r)
        self.engine_restarts = Counter("strata_engine_restarts", "Engine processes restarted after dying", registry=r)
        self.engine_death_requests = Counter(
            "strata_engine_death_requests", "Requests the engine held when it died, by outcome: recovered "
            "(answered in full after a restart) or failed (taken for the cause of repeated deaths)",
            ["outcome"], registry=r)
        # vLLM's names for the same figures, as inference gateways scrape them (serve/http/gateway_api.py)
        self.vllm_waiting = Gauge("vllm:num_requests_waiting", "Requests waiting: queued, parked or paused",
                                  registry=r)
        self.vllm_running = Gauge("vllm:num_requests_running", "Requests in the running batch", registry=r)
        self.vllm_kv_usage = Gauge("vllm:kv_cache_usage_perc", "Fraction of the KV pool held by requests (0-1)",
                                   registry=r)
        self._max_wait = 0.0

    def watch_scheduler(self, scheduler) -> None:
        """The queue and park gauges are read from the scheduler's state at scrape time."""
        self.queued.set_function(lambda: len(scheduler.waiting))
        self.parked.set_function(lambda: len(scheduler.parked))
        count = lambda state: sum((r.paused and state == "paused") or  # noqa: E731
                                  (not r.paused and r.reading == (state == "reading") and state != "paused")
                                  for r in scheduler.running)
        for state in ("reading", "decoding", "paused"):
            self.running.labels(state).set_function(lambda state=state: count(state))
        kv = lambda key: scheduler.kv_status().get(key, 0)  # noqa: E731
        for state, key in (("total", "kv_blocks"), ("used", "used"), ("cached", "cached"), ("free", "free")):
            self.kv_blocks.labels(state).set_function(lambda key=key: kv(key))
        self.kv_bytes_per_token.set_function(lambda: kv("bytes_per_token"))
        self.host_blocks.labels("held").set_function(lambda: kv("host_blocks"))
        self.host_blocks.labels("capacity").set_function(lambda: kv("cache_ram_blocks"))
        self.waiting_for_memory.set_function(lambda: int(scheduler.memory_full))
        self.expert_slots.set_function(lambda: kv("expert_cache").get("slots", 0) if kv("expert_cache") else 0)
        self.vllm_running.set_function(lambda: load_counts(scheduler)[0])
        self.vllm_waiting.set_function(lambda: load_counts(scheduler)[1])
        self.vllm_kv_usage.set_function(lambda: kv("used") / kv("kv_blocks") if kv("kv_blocks") else 0.0)

    def observe_speculation(self, drafted: int, accepted: int) -> None:
        """One request's drafted and accepted tokens (its DONE)."""
        self.spec_drafted.inc(drafted)
        self.spec_accepted.inc(accepted)

    def observe_expert_cache(self, moved: dict[str, int]) -> None:
        """What an engine's expert cache counted since its last pool report (EXPERT_KEYS)."""
        for key, counter in zip(EXPERT_KEYS, (self.expert_hits, self.expert_misses, self.expert_bytes,
                                              self.expert_tokens)):
            if moved.get(key):
                counter.inc(moved[key])

    def observe_prompt_reuse(self, cached: int, from_host: int = 0) -> None:
        """One request's prefix-cache lookup (its INFO after GEN); /status's prefix_cache counts the
        same per engine (Scheduler.reuse)."""
        self.reuse_lookups.inc()
        if cached:
            self.reuse_hits.inc()
            self.reused_tokens.inc(cached)
            self.host_reused_tokens.inc(from_host)

    def observe_queue_wait(self, seconds: float) -> None:
        self.queue_wait.observe(seconds)
        if seconds * 1000 > self._max_wait:
            self._max_wait = seconds * 1000
            self.max_queue_wait_ms.set(self._max_wait)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class ModelsMetrics:
    """Several models' registries as one exposition, each sample labelled with its model (`model`),
    each metric's family once (a scrape must not repeat a family). A prometheus_client collector."""

    def __init__(self, named: dict[str, Metrics]):
        self.named = named

    def collect(self):
        families: dict[str, Metric] = {}
        for model, metrics in self.named.items():
            for family in metrics.registry.collect():
                merged = families.setdefault(family.name, Metric(family.name, family.documentation, family.type,
                                                                 family.unit))
                for sample in family.samples:
                    merged.add_sample(sample.name, sample.labels | {"model": model}, sample.value, sample.timestamp,
                                      sample.exemplar)
        return list(families.values())

    def render(self) -> bytes:
        registry = CollectorRegistry(auto_describe=False)
        registry.register(self)
        return generate_latest(registry)
