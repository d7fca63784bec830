"""The FIFO and the engine's ownership periods.

Preemption off: one request owns the engine from GEN to DONE, strict FIFO.
Preemption on: periods GEN -> SUSPENDED and RESUME -> SUSPENDED | DONE. While the owner reads its
prompt, every PP is answered with a boundary offer (YIELD) when the next waiter is worth a park:
of the same or a higher class (`priority`, lower first; a lower class never preempts a higher
one), and either its own read is shorter than what the reader has left to read, or it has waited
aged_s. Waiters are served by class, then arrival. A parked request resumes once no waiter of its
class or above remains, or ahead of them once it has waited max_wait_s; then it reads to the end
without further offers, so its postponement is bounded. Decode never parks.

Engine death loses no request: the running and the parked requests go back to the front of the
queue (in arrival order) and run again on the restarted engine; one that had tokens continues
from its prompt plus those tokens. The request running at `max_retries` deaths is taken for their
cause (a poison request) and fails; the others are not blamed.
"""
from __future__ import annotations

import logging
import time
from collections import deque

from protocol import messages as m

from serve.engine_client import EngineClient, EngineState
from serve.metrics import Metrics
from serve.request import EngineFailure, Phase, Request

log = logging.getLogger("strata.scheduler")


class Scheduler:
    def __init__(self, metrics: Metrics, preempt: bool, max_wait_s: float, max_retries: int,
                 eos_ids: frozenset[int], aged_s: float = 4.0):
        self.metrics, self.preempt_wanted, self.max_wait_s, self.aged_s = metrics, preempt, max_wait_s, aged_s
        self.max_retries, self.eos_ids = max_retries, eos_ids
        self.engine: EngineClient | None = None
        self.waiting: deque[Request] = deque()
        self.owner: Request | None = None
        self.parked: Request | None = None
        self.requests: dict[int, Request] = {}  # every request the engine may still send lines for
        self.closed = False
        self._warned_no_cap = False
        metrics.watch_scheduler(self)

    @property
    def preempt(self) -> bool:
        return self.preempt_wanted and self.engine is not None and "preempt" in self.engine.info.caps

    # ------------------------------------------------------------ from the HTTP side

    def submit(self, req: Request) -> None:
        if self.closed or (self.engine is not None and self.engine.state is EngineState.FAILED):
            req.deliver(EngineFailure("the server is shutting down" if self.closed else
                                      f"the engine is unavailable: {self.engine.failure}"))
            return
        self.requests[req.id] = req
        self.waiting.append(req)
        self.dispatch()
        self.offer_boundary()

    def offer_boundary(self) -> None:
        """The next waiter is worth a park of the owner's read: offer one at its next boundary.
        Repeated after every PP, since a declined offer is consumed."""
        owner = self.owner
        if not (self.preempt and self.waiting and owner is not None and owner.reading and not owner.protected):
            return
        nxt = self.next_waiting()
        if nxt.priority > owner.priority:  # a lower class never preempts a higher one
            return
        left = len(owner.prompt) + len(owner.output) - owner.prompt_done  # what the reader has left to read
        if len(nxt.prompt) < left or time.monotonic() - nxt.arrived >= self.aged_s:
            self.engine.send(m.Yield())

    def next_waiting(self) -> Request:
        """The waiter served next: the highest class (lowest priority), then the earliest arrival
        (a request back from an engine death keeps its arrival, so it comes first in its class)."""
        return min(self.waiting, key=lambda r: (r.priority, r.arrived))

    def abandon(self, req: Request) -> None:
        """The client has gone (or no longer wants tokens): free whatever the request holds."""
        req.abandoned = True
        if req.phase is Phase.QUEUED:
            self._drop_waiting(req)
            self._forget(req)
        elif req.phase is Phase.RUNNING:
            self.engine.send(m.Stop(req.id))  # the period ends when DONE arrives
        elif req.phase is Phase.PARKED:
            self.engine.send(m.Cancel(req.id))
            self._unpark(req)
            self._forget(req)
            self.dispatch()

    # ------------------------------------------------------------ from the engine

    def on_message(self, msg: m.Message) -> None:
        req = self.requests.get(msg.id) if msg.id is not None else None
        if req is None:
            if isinstance(msg, m.Err):
                log.error("engine error: %s", msg.message)
            return
        handler = self._HANDLERS.get(type(msg))
        if handler:
            handler(self, req, msg)
        if not req.abandoned:
            req.deliver(msg)

    def _on_pp(self, req: Request, msg: m.PP) -> None:
        if req.first_chunk_at is None:  # the first chunk started msg.ms before this line
            req.first_chunk_at = time.monotonic() - msg.ms / 1000
            self.metrics.observe_queue_wait(req.queue_wait_s)
        req.prompt_done = min(msg.done, len(req.prompt))  # a continuation also re-reads its tokens
        self.metrics.prompt_tokens.inc(max(0, req.prompt_done - req.prompt_counted))
        req.prompt_counted = max(req.prompt_counted, req.prompt_done)
        if req is self.owner and msg.done < msg.total:
            self.offer_boundary()

    def _on_token(self, req: Request, msg: m.T) -> None:
        if req.first_token_at is None:
            req.first_token_at = time.monotonic()
            self.metrics.ttft.observe(req.ttft_s)
        req.output.append(msg.token)
        self.metrics.generated_tokens.inc()

    def _on_suspended(self, req: Request, msg: m.Suspended) -> None:
        req.phase, req.parks, req.parked_at = Phase.PARKED, req.parks + 1, time.monotonic()
        self.owner, self.parked = None, req
        self.metrics.preemptions.inc()
        self.dispatch()

    def _on_decline(self, req: Request, msg: m.Decline) -> None:
        self.metrics.declined.labels(msg.reason).inc()

    def _on_end(self, req: Request, msg: m.Done | m.Err) -> None:
        if req is self.owner:
            self.owner = None
        if isinstance(msg, m.Done) and req.restarts:
            self.metrics.engine_death_requests.labels("recovered").inc()
        self._end(req)
        self.dispatch()

    _HANDLERS = {m.PP: _on_pp, m.T: _on_token, m.Suspended: _on_suspended, m.Decline: _on_decline,
                 m.Done: _on_end, m.Err: _on_end}

    def on_malformed(self, line: str, error: str) -> None:
        """A line that does not parse fails the owner; the engine is told to stop it."""
        req = self.owner
        if req is None:
            return
        req.deliver(EngineFailure(f"the engine sent a malformed line ({error})", status=502))
        self.abandon(req)  # STOP it; the period ends at its DONE

    def on_engine_exit(self, reason: str) -> None:
        """What the engine held goes back to the front of the queue, to run on the restarted
        engine (dispatched when it is ready); the request it was running is blamed once."""
        self.metrics.engine_restarts.inc()
        owner, parked = self.owner, self.parked
        self.owner = None
        self._unpark(parked)
        if owner is not None:
            owner.deaths_running += 1
        held = sorted((r for r in (owner, parked) if r is not None), key=lambda r: r.arrived)
        self.waiting.extendleft(reversed([r for r in held if self._survives(r, reason)]))

    def _survives(self, req: Request, reason: str) -> bool:
        req.restarts += 1
        if req.abandoned:  # nobody waits for it any more
            self._end(req)
            return False
        if req.deaths_running >= self.max_retries:
            self.metrics.engine_death_requests.labels("failed").inc()
            log.error("request %d was running at %d engine deaths: failing it as their likely cause",
                      req.id, req.deaths_running)
            self._end(req)
            req.deliver(EngineFailure(f"{reason}; this request was running at {req.deaths_running} engine "
                                      f"deaths in a row, so it is taken for their cause and not retried"))
            return False
        if self._finished_before_death(req):
            return False
        log.warning("request %d will %s on the restarted engine", req.id,
                    f"continue after {req.generated} tokens" if req.output else "run again")
        req.requeue()
        return True

    def _finished_before_death(self, req: Request) -> bool:
        """Its last token ended it (length or a stop token) but the DONE was lost: end it here."""
        stop_ids = self.eos_ids | frozenset(req.sampling.get("stop", ()))
        finish = ("length" if req.generated >= req.max_tokens else
                  "stop" if req.output and req.output[-1] in stop_ids else None)
        if finish is not None:
            done = m.Done(req.generated, len(req.prompt), 0.0, 0.0, finish, {}, req.id)
            self._on_end(req, done)
            req.deliver(done)
        return finish is not None

    def on_engine_ready(self) -> None:
        if self.preempt_wanted and "preempt" not in self.engine.info.caps and not self._warned_no_cap:
            self._warned_no_cap = True
            log.warning("--prefill-preempt is on but the engine lacks the 'preempt' capability: serving FIFO")
        self.dispatch()

    def on_engine_failed(self) -> None:
        """Restarts are exhausted: nobody waiting can be served."""
        while self.waiting:
            req = self.waiting.popleft()
            req.deliver(EngineFailure(f"the engine is unavailable: {self.engine.failure}"))
            self._forget(req)

    # ------------------------------------------------------------ granting periods

    def dispatch(self) -> None:
        if self.owner is not None or self.engine is None or not self.engine.ready or self.closed:
            return
        ahead = self.parked is not None and any(w.priority <= self.parked.priority for w in self.waiting)
        if self.parked is not None and (not ahead or self._parked_too_long()):
            req = self.parked
            req.protected = ahead  # resumed ahead of waiters of its class: read to the end unparked
            self._unpark(req)
            self._grant(req, m.Resume(req.id))
            self.metrics.resumes.inc()
        elif self.waiting:
            req = self.next_waiting()
            self.waiting.remove(req)
            self._grant(req, req.gen())

    def _grant(self, req: Request, msg: m.Message) -> None:
        self.owner, req.phase = req, Phase.RUNNING
        self.engine.send(msg)

    def _parked_too_long(self) -> bool:
        return self.max_wait_s > 0 and time.monotonic() - self.parked.parked_at >= self.max_wait_s

    def _unpark(self, req: Request | None) -> None:
        if req is None or req is not self.parked:
            return
        waited = time.monotonic() - req.parked_at
        req.parked_s += waited
        self.metrics.park_duration.observe(waited)
        self.parked = None

    def _drop_waiting(self, req: Request) -> None:
        try:
            self.waiting.remove(req)
        except ValueError:
            pass

    def _forget(self, req: Request) -> None:
        self.requests.pop(req.id, None)

    def _end(self, req: Request) -> None:
        req.phase = Phase.DONE
        self._forget(req)

    def shutdown(self) -> None:
        """No new work; the waiting and the parked are answered now, the running request may
        finish (see stop_owner). Nothing is restarted from here on."""
        if self.closed:
            return
        self.closed = True
        for req in list(self.waiting) + [r for r in (self.parked,) if r is not None]:
            req.deliver(EngineFailure("the server is shutting down"))
            self._end(req)
        self.waiting.clear()
        self._unpark(self.parked)

    def stop_owner(self) -> None:
        """The shutdown grace is over: the running request is stopped and answered."""
        req, self.owner = self.owner, None
        if req is not None:
            self.engine.send(m.Stop(req.id))
            req.deliver(EngineFailure("the server is shutting down"))
            self._end(req)

    def status(self) -> dict:
        owner = self.owner
        return {
            "busy": owner is not None,
            "queued": len(self.waiting),
            "phase": "idle" if owner is None else ("reading" if owner.reading else "decoding"),
            "prompt_progress": None if owner is None else
            {"id": owner.id, "done": owner.prompt_done, "total": len(owner.prompt), "generated": owner.generated},
            "parked_requests": int(self.parked is not None),
            "parked": [] if self.parked is None else
            [{"id": self.parked.id, "done": self.parked.prompt_done, "total": len(self.parked.prompt),
              "parks": self.parked.parks, "parked_s": round(time.monotonic() - self.parked.parked_at, 3)}],
            "preempt": self.preempt,
        }
