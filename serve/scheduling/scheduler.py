"""The queue, and admission into the engine.

The engine takes up to `max_running` requests at once (INFO max_running=N; one for an engine that
does not say), as far as its pool of KV blocks allows: a GEN whose first chunk's blocks cannot be
had is answered DEFER memory, and the request waits in the queue, its place kept, until a request
ends and frees blocks (no GEN is sent meanwhile). Their decode steps run as one batch, their prompt
reads one chunk at a time in the order they went in (the read in front reads). Waiters are served by class (`priority`, lower first), then arrival.
Preemption off: reads run in that order, strict FIFO.
Preemption on: while the read in front goes on, every PP is answered with a boundary offer (YIELD
id=N) when a later request is worth a park: a waiter in the queue or a read behind it in the
engine, of the same or a higher class (a lower class never preempts a higher one), whose own read
is shorter than what the front read has left, or which has waited aged_s. The parked read keeps its
blocks (the engine moves it to host memory only when memory runs short). It resumes once the
requests it made way for (the reads behind it when it parked, and every request that went in while
it was parked) have finished and no waiter of its class or above remains, so the short request runs
on a quiet engine; or, once it has been postponed max_wait_s, ahead of them all, and then it reads
to the end without further offers, so its postponement is bounded. Decode never parks.

Engine death loses no request: the running and the parked requests go back to the front of the
queue (in arrival order) and run again on the restarted engine; one that had tokens continues
from its prompt plus those tokens. A request blamed for `max_retries` deaths is taken for their
cause (a poison request) and fails: the read in front is blamed (its chunk was running), else the
decoding requests.
"""
from __future__ import annotations

import logging
import re
import time
from collections import deque

from protocol import messages as m

from serve.engine_proc.engine_client import EngineClient, EngineState
from serve.scheduling.metrics import REUSE_KEYS, Metrics, reuse_summary
from serve.scheduling.request import EngineFailure, Phase, Request

log = logging.getLogger("strata.scheduler")


class Scheduler:
    def __init__(self, metrics: Metrics, preempt: bool, max_wait_s: float, max_retries: int,
                 eos_ids: frozenset[int], aged_s: float = 4.0):
        self.metrics, self.preempt_wanted, self.max_wait_s, self.aged_s = metrics, preempt, max_wait_s, aged_s
        self.max_retries, self.eos_ids = max_retries, eos_ids
        self.engine: EngineClient | None = None
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []  # in the engine, reading or decoding, in the order they went in
        self.line: list[Request] = []  # the running that still read, in the engine's order: the first reads
        self.parked: list[Request] = []  # parked reads, oldest park first
        self.requests: dict[int, Request] = {}  # every request the engine may still send lines for
        self.closed = False
        self.memory_full = False  # the engine deferred a request for memory: nothing goes in until one ends or parks
        self.deferred = 0  # DEFER lines seen
        self.pool: dict[str, int] = {}  # the engine's latest pool report (INFO without an id)
        self.reuse = dict.fromkeys(REUSE_KEYS, 0)  # this engine's prefix-cache lookups (/status)
        self._warned_no_cap = False
        metrics.watch_scheduler(self)

    @property
    def preempt(self) -> bool:
        return self.preempt_wanted and self.engine is not None and "preempt" in self.engine.info.caps

    @property
    def ready(self) -> bool:
        return self.engine is not None and self.engine.ready and not self.closed

    @property
    def failed(self) -> bool:
        return self.engine is not None and self.engine.state is EngineState.FAILED

    @property
    def free_blocks(self) -> int:
        return self.pool.get("free", 0)

    @property
    def max_running(self) -> int:
        """Requests the engine takes at once: its INFO max_running=N (an engine that does not say takes one)."""
        try:
            return max(1, int(self.engine.info.fields.get("max_running", 1))) if self.engine is not None else 1
        except ValueError:
            return 1

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

    def hand_over(self, req: Request) -> None:
        """A waiter leaves this queue for another engine's (serve/scheduling/engine_router.py)."""
        self._drop_waiting(req)
        self._forget(req)

    def offer_boundary(self) -> None:
        """The read in front is worth parking for a later one: offer a park at its next boundary.
        Repeated after every PP, since a declined offer is consumed. The later one is a waiter in
        the queue or a read behind it in the engine, of the same or a higher class, whose own read
        is shorter than what the front read has left, or which has waited aged_s (in the queue, or
        in the engine's line since it went in)."""
        if not (self.preempt and self.line):
            return
        head = self.line[0]
        if head.protected or not head.reading:
            return
        now = time.monotonic()
        candidates = [(r, now - r.arrived) for r in self.waiting] + [(r, now - r.lined_at) for r in self.line[1:]]
        if not candidates:
            return
        nxt, waited = min(candidates, key=lambda c: (c[0].priority, c[0].arrived))
        if nxt.priority > head.priority:  # a lower class never preempts a higher one
            return
        if nxt.left_to_read < head.left_to_read or waited >= self.aged_s:
            self.engine.send(m.Yield(head.id))

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
            self.engine.send(m.Stop(req.id))  # its blocks go when DONE arrives
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
            elif isinstance(msg, m.Info) and msg.id is None:
                self._on_pool(msg)
            return
        handler = self._HANDLERS.get(type(msg))
        if handler:
            handler(self, req, msg)
        if not req.abandoned and not isinstance(msg, (m.Info, m.Defer)):
            req.deliver(msg)

    def _on_pool(self, msg: m.Info) -> None:
        """The engine's pool report: blocks used / cached / free, paused requests, ..."""
        for key, value in msg.fields.items():
            if key.startswith("pool_"):
                try:
                    self.pool[key[5:]] = int(value)
                except ValueError:
                    pass

    def _on_info(self, req: Request, msg: m.Info) -> None:
        """Where the request's rows are (host=1: a parked read moved to host memory; paused=1: moved
        out for memory) and, after its GEN, the prompt tokens the prefix cache saved it."""
        fields = msg.fields
        if "host" in fields:
            req.in_host = fields["host"] == "1"
        if "paused" in fields:
            req.paused = req.in_host = fields["paused"] == "1"
        if "cached" not in fields:
            return
        try:
            req.cached, from_host = int(fields["cached"]), int(fields.get("from_host", 0))
        except ValueError:
            return
        self.metrics.observe_prompt_reuse(req.cached, from_host)
        self.reuse["lookups"] += 1
        if req.cached:
            self.reuse["hits"] += 1
            self.reuse["tokens_reused"] += req.cached
            self.reuse["tokens_from_host"] += from_host
        if req.cached:
            req.prompt_done = req.cached

    def _on_defer(self, req: Request, msg: m.Defer) -> None:
        """The engine did not take it now: back where it was (its place kept), and no GEN or RESUME
        goes in until a request ends or parks (for memory; for the engine's cap, until one ends too)."""
        self.deferred += 1
        self.metrics.deferred.labels(msg.reason).inc()
        self._leave(req)
        for other in self.parked:
            other.yielded_to.discard(req.id)
        if req.resuming:
            req.phase = Phase.PARKED
            self.parked.insert(0, req)
        else:
            req.phase = Phase.QUEUED
            self.waiting.append(req)
        self.memory_full = True

    def _on_pp(self, req: Request, msg: m.PP) -> None:
        if req.first_chunk_at is None:  # the first chunk started msg.ms before this line
            req.first_chunk_at = time.monotonic() - msg.ms / 1000
            self.metrics.observe_queue_wait(req.queue_wait_s)
        req.prompt_done = min(msg.done, len(req.prompt))  # a continuation also re-reads its tokens
        self.metrics.prompt_tokens.inc(max(0, req.prompt_done - req.prompt_counted))
        req.prompt_counted = max(req.prompt_counted, req.prompt_done)
        if msg.done >= msg.total:
            self._unline(req)
        if self.parked:  # one postponed max_wait_s resumes at the next line, not at the next token
            self.dispatch()
        if self.line:
            self.offer_boundary()

    def _on_token(self, req: Request, msg: m.T) -> None:
        if req.first_token_at is None:
            req.first_token_at = time.monotonic()
            self.metrics.ttft.observe(req.ttft_s)
        self._unline(req)
        req.output.append(msg.token)
        self.metrics.generated_tokens.inc()
        if self.parked:  # one postponed max_wait_s by a long answer resumes without waiting for its end
            self.dispatch()

    def _on_suspended(self, req: Request, msg: m.Suspended) -> None:
        # a parked read's blocks can be moved out on demand: a request deferred for memory may fit now
        # (and if nothing else runs, no DONE would ever come to let it in)
        self.memory_full = False
        req.phase, req.parks, req.parked_at = Phase.PARKED, req.parks + 1, time.monotonic()
        if req.first_parked_at is None:
            req.first_parked_at = req.parked_at
        self._leave(req)
        req.yielded_to = {r.id for r in self.line}  # the reads behind it (waiters join as they go in)
        self.parked.append(req)
        self.metrics.preemptions.inc()
        self.dispatch()
        self.offer_boundary()

    def _on_decline(self, req: Request, msg: m.Decline) -> None:
        self.metrics.declined.labels(msg.reason).inc()

    def _on_end(self, req: Request, msg: m.Done | m.Err) -> None:
        self.memory_full = False  # its blocks are free: deferred requests may go in
        self._leave(req)
        self._unpark(req)
        if isinstance(msg, m.Done) and req.restarts:
            self.metrics.engine_death_requests.labels("recovered").inc()
        self._end(req)
        self.dispatch()
        self.offer_boundary()

    _HANDLERS = {m.Info: _on_info, m.PP: _on_pp, m.T: _on_token, m.Suspended: _on_suspended, m.Decline: _on_decline,
                 m.Defer: _on_defer, m.Done: _on_end, m.Err: _on_end}

    def on_malformed(self, line: str, error: str) -> None:
        """A line that does not parse fails the request it names (else the read in front, else the
        first running one); the engine is told to stop it."""
        named = re.search(r" id=([0-9]+)\s*$", line)
        req = self.requests.get(int(named.group(1))) if named else None
        req = req or (self.line[0] if self.line else self.running[0] if self.running else None)
        if req is None or req.phase is not Phase.RUNNING:
            return
        req.deliver(EngineFailure(f"the engine sent a malformed line ({error})", status=502))
        self.abandon(req)  # STOP it; its blocks go at its DONE

    def on_engine_exit(self, reason: str) -> None:
        """What the engine held goes back to the front of the queue, to run on the restarted
        engine (dispatched when it is ready). Blamed once: the read in front if there was one (the
        engine was reading its chunk), else every decoding request (they were stepped together)."""
        self.metrics.engine_restarts.inc()
        self.memory_full, self.pool = False, {}
        running, parked = list(self.running), list(self.parked)
        for req in (self.line[:1] if self.line else running):
            req.deaths_running += 1
        self.running, self.line = [], []
        for req in parked:
            self._unpark(req)
        held = sorted(running + parked, key=lambda r: r.arrived)
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
        self.offer_boundary()

    def on_engine_failed(self) -> None:
        """Restarts are exhausted: nobody waiting can be served."""
        while self.waiting:
            req = self.waiting.popleft()
            req.deliver(EngineFailure(f"the engine is unavailable: {self.engine.failure}"))
            self._forget(req)

    # ------------------------------------------------------------ admission

    def dispatch(self) -> None:
        """Fill the engine up to its cap while its memory allows: a parked read resumes once the
        requests it made way for have finished and no waiter of its class or above is left (or,
        having been postponed max_wait_s, ahead of them, and then reads to the end unparked);
        otherwise the next waiter goes in. A parked read keeps its blocks in the engine until
        memory runs short (the engine then moves its rows to host memory)."""
        if self.engine is None or not self.engine.ready or self.closed or self.memory_full:
            return
        while len(self.running) < self.max_running:
            parked = self.parked[0] if self.parked else None
            ahead = parked is not None and (any(w.priority <= parked.priority for w in self.waiting) or
                                            any(r.id in parked.yielded_to for r in self.running))
            if parked is not None and (not ahead or self._postponed_too_long(parked)):
                parked.protected = self._postponed_too_long(parked)
                self._unpark(parked)
                self._grant(parked, m.Resume(parked.id))
                self.metrics.resumes.inc()
            elif self.waiting:
                req = self.next_waiting()
                self.waiting.remove(req)
                self._grant(req, req.gen())
            else:
                return

    def _grant(self, req: Request, msg: m.Message) -> None:
        req.phase, req.lined_at, req.resuming = Phase.RUNNING, time.monotonic(), isinstance(msg, m.Resume)
        for parked in self.parked:
            if parked is not req:
                parked.yielded_to.add(req.id)
        self.running.append(req)
        if req.generated == 0:
            self.line.append(req)
        self.engine.send(msg)

    def _postponed_too_long(self, req: Request) -> bool:
        return self.max_wait_s > 0 and time.monotonic() - req.first_parked_at >= self.max_wait_s

    def _unline(self, req: Request) -> None:
        if req in self.line:
            self.line.remove(req)

    def _leave(self, req: Request) -> None:
        """No longer running (parked or ended)."""
        self._unline(req)
        if req in self.running:
            self.running.remove(req)

    def _unpark(self, req: Request | None) -> None:
        if req is None or req not in self.parked:
            return
        waited = time.monotonic() - req.parked_at
        req.parked_s += waited
        self.metrics.park_duration.observe(waited)
        self.parked.remove(req)

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
        """No new work; the waiting and the parked are answered now, the running requests may
        finish (see stop_running). Nothing is restarted from here on."""
        if self.closed:
            return
        self.closed = True
        for req in list(self.waiting) + list(self.parked):
            req.deliver(EngineFailure("the server is shutting down"))
            self._end(req)
        self.waiting.clear()
        for req in list(self.parked):
            self._unpark(req)

    def stop_running(self) -> None:
        """The shutdown grace is over: the running requests are stopped and answered."""
        running, self.running, self.line = list(self.running), [], []
        for req in running:
            self.engine.send(m.Stop(req.id))
            req.deliver(EngineFailure("the server is shutting down"))
            self._end(req)

    def status(self) -> dict:
        now = time.monotonic()
        head = self.line[0] if self.line else (self.running[0] if self.running else None)
        progress = lambda r: {"id": r.id, "done": r.prompt_done, "total": len(r.prompt),  # noqa: E731
                              "generated": r.generated}
        return {
            "busy": bool(self.running),
            "queued": len(self.waiting),
            "phase": "idle" if head is None else ("reading" if head.reading else "decoding"),
            "prompt_progress": None if head is None else progress(head),
            "max_running": self.max_running,
            "kv": self.kv_status(),
            "running": [progress(r) | {"state": "paused" if r.paused else "reading" if r.reading else "decoding",
                                       "cached": r.cached, "priority": r.priority} for r in self.running],
            "parked_requests": len(self.parked),
            "parked": [progress(r) | {"parks": r.parks, "parked_s": round(now - r.parked_at, 3),
                                      "in_host_memory": r.in_host} for r in self.parked],
            "waiting_for_memory": self.memory_full,
            "waiting": [{"id": r.id, "prompt_tokens": len(r.prompt), "priority": r.priority,
                         "waited_s": round(now - r.arrived, 3)} for r in self.waiting],
            "preempt": self.preempt,
        }

    def kv_status(self) -> dict:
        """The engine's pool as it last reported it, with what the server knows of its requests."""
        fields = self.engine.info.fields if self.engine is not None else {}
        out = {k: int(fields[k]) for k in ("kv_blocks", "kv_block", "kv_block_bytes", "cache_ram_blocks")
               if fields.get(k, "").isdigit()}
        if "kv_block" in out and "kv_block_bytes" in out:
            out["bytes_per_token"] = out["kv_block_bytes"] // max(1, out["kv_block"])
        return out | self.pool | {"paused": sum(r.paused for r in self.running), "deferred": self.deferred,
                                  "prefix_cache": reuse_summary(self.reuse)}
