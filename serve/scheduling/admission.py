"""Admission into one engine: who goes in, who is offered a park, and what the engine is told
when a client leaves. The one part of the scheduler that sends the engine work.

The engine takes up to `max_running` requests at once (INFO max_running=N; one for an engine that
does not say), as far as its pool of KV blocks allows: a GEN whose first chunk's blocks cannot be
had is answered DEFER memory, and the request waits in the queue, its place kept, until a request
ends and frees blocks (no GEN is sent meanwhile). Their decode steps run as one batch, their prompt
reads one chunk at a time in the order they went in (the read in front reads). Waiters are served
by class (`priority`, lower first), then arrival.
Preemption off: reads run in that order, strict FIFO.
Preemption on: while the read in front goes on, every PP is answered with a boundary offer (YIELD
id=N) when a later request is worth a park: a waiter in the queue or a read behind it in the
engine, of the same or a higher class (a lower class never preempts a higher one), whose own read
is shorter than what the front read has left, or which has waited aged_s. An engine whose reads share
a step (INFO shape_free=1: the engine fills each prompt step from every read in its line) is offered a
park for a waiter only: a read behind the front one already reads beside it, and parking the front read
would only hold it back until the others finish. The parked read keeps its
blocks (the engine moves it to host memory only when memory runs short). It resumes once the
requests it made way for (the reads behind it when it parked, and every request that went in while
it was parked) have finished and no waiter of its class or above remains, so the short request runs
on a quiet engine; or, once it has been postponed max_wait_s, ahead of them all, and then it reads
to the end without further offers, so its postponement is bounded. Decode never parks.
"""
from __future__ import annotations

import logging
from typing import Callable

from protocol import messages as m

from serve.engine_proc.engine_client import EngineClient
from serve.scheduling.metrics import Metrics
from serve.scheduling.places import Places
from serve.scheduling.request import Phase, Request

log = logging.getLogger("strata.scheduler")


class Admission:
    def __init__(self, places: Places, metrics: Metrics, clock: Callable[[], float],
                 preempt: bool, max_wait_s: float, aged_s: float):
        self.places, self.metrics, self.clock = places, metrics, clock
        self.preempt_wanted, self.max_wait_s, self.aged_s = preempt, max_wait_s, aged_s
        self.engine: EngineClient | None = None
        self.closed = False  # shutting down: nothing goes in
        self.memory_full = False  # the engine deferred a request for memory: nothing goes in until one ends or parks
        self._warned_no_cap = False

    @property
    def preempt(self) -> bool:
        return self.preempt_wanted and self.engine is not None and "preempt" in self.engine.info.caps

    @property
    def shared_steps(self) -> bool:
        """The engine's reads share its prompt steps (INFO shape_free=1)."""
        return self.engine is not None and self.engine.info.fields.get("shape_free") == "1"

    @property
    def max_running(self) -> int:
        """Requests the engine takes at once: its INFO max_running=N (an engine that does not say takes one)."""
        try:
            return max(1, int(self.engine.info.fields.get("max_running", 1))) if self.engine is not None else 1
        except ValueError:
            return 1

    def engine_ready(self) -> None:
        if self.preempt_wanted and "preempt" not in self.engine.info.caps and not self._warned_no_cap:
            self._warned_no_cap = True
            log.warning("--prefill-preempt is on but the engine lacks the 'preempt' capability: serving FIFO")
        self.dispatch()
        self.offer_boundary()

    # ------------------------------------------------------------ who goes in

    def dispatch(self) -> None:
        """Fill the engine up to its cap while its memory allows: a parked read resumes once the
        requests it made way for have finished and no waiter of its class or above is left (or,
        having been postponed max_wait_s, ahead of them, and then reads to the end unparked);
        otherwise the next waiter goes in. A parked read keeps its blocks in the engine until
        memory runs short (the engine then moves its rows to host memory)."""
        if self.engine is None or not self.engine.ready or self.closed or self.memory_full:
            return
        places = self.places
        while len(places.running) < self.max_running:
            parked = places.parked[0] if places.parked else None
            ahead = parked is not None and (any(w.priority <= parked.priority for w in places.waiting) or
                                            any(r.id in parked.yielded_to for r in places.running))
            if parked is not None and (not ahead or self.postponed_too_long(parked)):
                parked.protected = self.postponed_too_long(parked)
                places.unpark(parked)
                self._grant(parked, m.Resume(parked.id))
                self.metrics.resumes.inc()
            elif places.waiting:
                req = self.next_waiting()
                places.waiting.remove(req)
                self._grant(req, req.gen())
            else:
                return

    def next_waiting(self) -> Request:
        """The waiter served next: the highest class (lowest priority), then the earliest arrival
        (a request back from an engine death keeps its arrival, so it comes first in its class)."""
        return min(self.places.waiting, key=lambda r: (r.priority, r.arrived))

    def _grant(self, req: Request, msg: m.Message) -> None:
        self.places.enter(req, resuming=isinstance(msg, m.Resume))
        self.engine.send(msg)

    def postponed_too_long(self, req: Request) -> bool:
        return self.max_wait_s > 0 and self.clock() - req.first_parked_at >= self.max_wait_s

    # ------------------------------------------------------------ who is offered a park

    def offer_boundary(self) -> None:
        """The read in front is worth parking for a later one: offer a park at its next boundary.
        Repeated after every PP, since a declined offer is consumed. The later one is a waiter in
        the queue or a read behind it in the engine, of the same or a higher class, whose own read
        is shorter than what the front read has left, or which has waited aged_s (in the queue, or
        in the engine's line since it went in: not where reads share a step)."""
        line = self.places.line
        if not (self.preempt and line):
            return
        head = line[0]
        if head.protected or not head.reading:
            return
        now = self.clock()
        candidates = [(r, now - r.arrived) for r in self.places.waiting]
        if not self.shared_steps:  # else the reads behind the front one read beside it already
            candidates += [(r, now - r.lined_at) for r in line[1:]]
        if not candidates:
            return
        nxt, waited = min(candidates, key=lambda c: (c[0].priority, c[0].arrived))
        if nxt.priority > head.priority:  # a lower class never preempts a higher one
            return
        if nxt.left_to_read < head.left_to_read or waited >= self.aged_s:
            self.engine.send(m.Yield(head.id))

    # ------------------------------------------------------------ who leaves

    def abandon(self, req: Request) -> None:
        """The client has gone (or no longer wants tokens): free whatever the request holds."""
        req.abandoned = True
        if req.phase is Phase.QUEUED:
            self.places.drop_waiting(req)
            self.places.forget(req)
        elif req.phase is Phase.RUNNING:
            self.engine.send(m.Stop(req.id))  # its blocks go when DONE arrives
        elif req.phase is Phase.PARKED:
            self.engine.send(m.Cancel(req.id))
            self.places.unpark(req)
            self.places.forget(req)
            self.dispatch()
