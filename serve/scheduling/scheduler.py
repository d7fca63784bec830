"""One engine's queue: its parts composed, and the entry points the HTTP side (through the router),
the engine client and the router call.

The parts, each owning its state: `Places` (where each request is: waiting, running, parked),
`Admission` (who goes in, who is offered a park, what the engine is told; the policy is described
there), `EngineLines` (a handler per engine line), `Recovery` (engine deaths, poison requests,
malformed lines), `PoolReport` (what the engine reported of its pool) and `StatusView` (/status).
One `Request` carries each request's state through all of them.
"""
from __future__ import annotations

import time
from collections import deque
from typing import Callable

from protocol import messages as m

from serve.engine_proc.engine_client import EngineClient, EngineState
from serve.scheduling.admission import Admission
from serve.scheduling.engine_lines import EngineLines
from serve.scheduling.metrics import Metrics
from serve.scheduling.places import Places
from serve.scheduling.pool_report import PoolReport
from serve.scheduling.recovery import Recovery
from serve.scheduling.request import EngineFailure, Request
from serve.scheduling.status_view import StatusView


class Scheduler:
    def __init__(self, metrics: Metrics, preempt: bool, max_wait_s: float, max_retries: int,
                 eos_ids: frozenset[int], aged_s: float = 4.0, clock: Callable[[], float] = time.monotonic):
        """clock: the time the policy reads (tests pass a fake one)."""
        self.places = Places(metrics, clock)
        self.report = PoolReport()
        self.admission = Admission(self.places, metrics, clock, preempt, max_wait_s, aged_s)
        self.lines = EngineLines(self.places, self.admission, self.report, metrics, clock)
        self.recovery = Recovery(self.places, self.admission, self.lines, self.report, metrics, max_retries, eos_ids)
        self.view = StatusView(self.places, self.admission, self.report, clock)
        metrics.watch_scheduler(self)

    # ------------------------------------------------------------ what the router and the metrics read

    @property
    def engine(self) -> EngineClient | None:
        return self.admission.engine

    @engine.setter
    def engine(self, engine: EngineClient | None) -> None:
        self.admission.engine = engine

    @property
    def waiting(self) -> deque[Request]:
        return self.places.waiting

    @property
    def running(self) -> list[Request]:
        return self.places.running

    @property
    def parked(self) -> list[Request]:
        return self.places.parked

    @property
    def memory_full(self) -> bool:
        return self.admission.memory_full

    @property
    def reuse(self) -> dict[str, int]:
        return self.report.reuse

    @property
    def free_blocks(self) -> int:
        return self.report.free_blocks

    @property
    def preempt(self) -> bool:
        return self.admission.preempt

    @property
    def max_running(self) -> int:
        return self.admission.max_running

    @property
    def ready(self) -> bool:
        return self.engine is not None and self.engine.ready and not self.admission.closed

    @property
    def failed(self) -> bool:
        return self.engine is not None and self.engine.state is EngineState.FAILED

    def status(self) -> dict:
        return self.view.status()

    def kv_status(self) -> dict:
        return self.view.kv_status()

    # ------------------------------------------------------------ from the HTTP side

    def submit(self, req: Request) -> None:
        if self.admission.closed or self.failed:
            req.deliver(EngineFailure("the server is shutting down" if self.admission.closed else
                                      f"the engine is unavailable: {self.engine.failure}"))
            return
        self.places.add(req)
        self.admission.dispatch()
        self.admission.offer_boundary()

    def hand_over(self, req: Request) -> None:
        """A waiter leaves this queue for another engine's (serve/scheduling/engine_router.py)."""
        self.places.drop_waiting(req)
        self.places.forget(req)

    def abandon(self, req: Request) -> None:
        self.admission.abandon(req)

    # ------------------------------------------------------------ from the engine client

    def on_message(self, msg: m.Message) -> None:
        self.lines.on_message(msg)

    def on_malformed(self, line: str, error: str) -> None:
        self.recovery.on_malformed(line, error)

    def on_engine_exit(self, reason: str, blame: bool = True) -> None:
        self.recovery.on_engine_exit(reason, blame)

    def on_engine_ready(self) -> None:
        self.admission.engine_ready()

    def on_engine_failed(self) -> None:
        self.recovery.on_engine_failed()

    # ------------------------------------------------------------ shutdown

    def shutdown(self) -> None:
        """No new work; the waiting and the parked are answered now, the running requests may
        finish (see stop_running). Nothing is restarted from here on."""
        if self.admission.closed:
            return
        self.admission.closed = True
        places = self.places
        for req in list(places.waiting) + list(places.parked):
            req.deliver(EngineFailure("the server is shutting down"))
            places.end(req)
        places.waiting.clear()
        for req in list(places.parked):
            places.unpark(req)

    def stop_running(self) -> None:
        """The shutdown grace is over: the running requests are stopped and answered."""
        for req in self.places.take_running():
            self.engine.send(m.Stop(req.id))
            req.deliver(EngineFailure("the server is shutting down"))
            self.places.end(req)
