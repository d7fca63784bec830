"""Where each of one engine's requests is: the queue, the engine (the running, and among them the
reads still in line), the parked reads; and the moves between them, each keeping a request's phase
with its place. The decisions (who moves, when) are the admission's, the engine lines' and the
recovery's; this only moves."""
from __future__ import annotations

from collections import deque
from typing import Callable

from serve.scheduling.metrics import Metrics
from serve.scheduling.request import Phase, Request


class Places:
    def __init__(self, metrics: Metrics, clock: Callable[[], float]):
        self.metrics, self.clock = metrics, clock
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []  # in the engine, reading or decoding, in the order they went in
        self.line: list[Request] = []  # the running that still read, in the engine's order: the first reads
        self.parked: list[Request] = []  # parked reads, oldest park first
        self.requests: dict[int, Request] = {}  # every request the engine may still send lines for

    @property
    def front(self) -> Request | None:
        """The read in front, else the first running request."""
        return self.line[0] if self.line else (self.running[0] if self.running else None)

    def add(self, req: Request) -> None:
        self.requests[req.id] = req
        self.waiting.append(req)

    def enter(self, req: Request, resuming: bool) -> None:
        """Into the engine (a GEN, or a RESUME): every other parked read made way for it too."""
        req.phase, req.lined_at, req.resuming = Phase.RUNNING, self.clock(), resuming
        for parked in self.parked:
            if parked is not req:
                parked.yielded_to.add(req.id)
        self.running.append(req)
        if req.generated == 0:
            self.line.append(req)

    def park(self, req: Request) -> None:
        """Its read is suspended: it made way for the reads behind it (waiters join as they go in)."""
        req.phase, req.parks, req.parked_at = Phase.PARKED, req.parks + 1, self.clock()
        if req.first_parked_at is None:
            req.first_parked_at = req.parked_at
        self.leave(req)
        req.yielded_to = {r.id for r in self.line}
        self.parked.append(req)

    def put_back(self, req: Request) -> None:
        """Not taken by the engine now: back where it was, its place kept."""
        self.leave(req)
        for other in self.parked:
            other.yielded_to.discard(req.id)
        if req.resuming:
            req.phase = Phase.PARKED
            self.parked.insert(0, req)
        else:
            req.phase = Phase.QUEUED
            self.waiting.append(req)

    def unline(self, req: Request) -> None:
        if req in self.line:
            self.line.remove(req)

    def leave(self, req: Request) -> None:
        """No longer running (parked or ended)."""
        self.unline(req)
        if req in self.running:
            self.running.remove(req)

    def unpark(self, req: Request | None) -> None:
        if req is None or req not in self.parked:
            return
        waited = self.clock() - req.parked_at
        req.parked_s += waited
        self.metrics.park_duration.observe(waited)
        self.parked.remove(req)

    def take_running(self) -> list[Request]:
        """Nothing runs in the engine any more: the requests that did."""
        running, self.running, self.line = list(self.running), [], []
        return running

    def drop_waiting(self, req: Request) -> None:
        try:
            self.waiting.remove(req)
        except ValueError:
            pass

    def forget(self, req: Request) -> None:
        self.requests.pop(req.id, None)

    def end(self, req: Request) -> None:
        req.phase = Phase.DONE
        self.forget(req)
