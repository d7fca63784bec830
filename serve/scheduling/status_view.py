"""One engine's queue as /status, the metrics and the page read it: where each request is, and the
engine's pool as it last reported it."""
from __future__ import annotations

from typing import Callable

from serve.scheduling.admission import Admission
from serve.scheduling.metrics import expert_summary, reuse_summary
from serve.scheduling.places import Places
from serve.scheduling.pool_report import PoolReport


class StatusView:
    def __init__(self, places: Places, admission: Admission, report: PoolReport, clock: Callable[[], float]):
        self.places, self.admission, self.report, self.clock = places, admission, report, clock

    def status(self) -> dict:
        now, places = self.clock(), self.places
        head = places.front
        progress = lambda r: {"id": r.id, "done": r.prompt_done, "total": len(r.prompt),  # noqa: E731
                              "generated": r.generated}
        return {
            "busy": bool(places.running),
            "queued": len(places.waiting),
            "phase": "idle" if head is None else ("reading" if head.reading else "decoding"),
            "prompt_progress": None if head is None else progress(head),
            "max_running": self.admission.max_running,
            "kv": self.kv_status(),
            "running": [progress(r) | {"state": "paused" if r.paused else "reading" if r.reading else "decoding",
                                       "cached": r.cached, "priority": r.priority} for r in places.running],
            "parked_requests": len(places.parked),
            "parked": [progress(r) | {"parks": r.parks, "parked_s": round(now - r.parked_at, 3),
                                      "in_host_memory": r.in_host} for r in places.parked],
            "waiting_for_memory": self.admission.memory_full,
            "waiting": [{"id": r.id, "prompt_tokens": len(r.prompt), "priority": r.priority,
                         "waited_s": round(now - r.arrived, 3)} for r in places.waiting],
            "preempt": self.admission.preempt,
        }

    def kv_status(self) -> dict:
        """The engine's pool as it last reported it, with what the server knows of its requests."""
        engine, report = self.admission.engine, self.report
        fields = engine.info.fields if engine is not None else {}
        out = {k: int(fields[k]) for k in ("kv_blocks", "kv_block", "kv_block_bytes", "cache_ram_blocks")
               if fields.get(k, "").isdigit()}
        if "kv_block" in out and "kv_block_bytes" in out:
            out["bytes_per_token"] = out["kv_block_bytes"] // max(1, out["kv_block"])
        return out | expert_summary(report.pool) | {"paused": sum(r.paused for r in self.places.running),
                                                     "deferred": report.deferred,
                                                     "prefix_cache": reuse_summary(report.reuse)}
