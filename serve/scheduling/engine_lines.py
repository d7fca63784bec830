"""One engine's lines about its requests, a handler a kind (PP, T, EMB, SUSPENDED, DEFER, DONE, ...):
each moves the request and counts it, then lets the admission act on what changed; the line is
then delivered to the request's client."""
from __future__ import annotations

import logging
from typing import Callable

from protocol import messages as m

from serve.scheduling.admission import Admission
from serve.scheduling.metrics import Metrics
from serve.scheduling.places import Places
from serve.scheduling.pool_report import PoolReport
from serve.scheduling.request import Request

log = logging.getLogger("strata.scheduler")


class EngineLines:
    def __init__(self, places: Places, admission: Admission, report: PoolReport, metrics: Metrics,
                 clock: Callable[[], float]):
        self.places, self.admission, self.report, self.metrics, self.clock = places, admission, report, metrics, clock

    def on_message(self, msg: m.Message) -> None:
        req = self.places.requests.get(msg.id) if msg.id is not None else None
        if req is None:
            if isinstance(msg, m.Err):
                log.error("engine error: %s", msg.message)
            elif isinstance(msg, m.Info) and msg.id is None:
                self.metrics.observe_expert_cache(self.report.on_pool(msg))
            return
        handler = self._HANDLERS.get(type(msg))
        if handler:
            handler(self, req, msg)
        if not req.abandoned and not isinstance(msg, (m.Info, m.Defer)):
            req.deliver(msg)

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
        self.report.count_reuse(req.cached, from_host)
        if req.cached:
            req.prompt_done = req.cached

    def _on_defer(self, req: Request, msg: m.Defer) -> None:
        """The engine did not take it now: back where it was (its place kept), and no GEN or RESUME
        goes in until a request ends or parks (for memory; for the engine's cap, until one ends too)."""
        self.report.deferred += 1
        self.metrics.deferred.labels(msg.reason).inc()
        self.places.put_back(req)
        self.admission.memory_full = True

    def _on_pp(self, req: Request, msg: m.PromptProgress) -> None:
        if req.first_chunk_at is None:  # the first chunk started msg.ms before this line
            req.first_chunk_at = self.clock() - msg.ms / 1000
            self.metrics.observe_queue_wait(req.queue_wait_s)
        req.prompt_done = min(msg.done, len(req.prompt))  # a continuation also re-reads its tokens
        self.metrics.prompt_tokens.inc(max(0, req.prompt_done - req.prompt_counted))
        req.prompt_counted = max(req.prompt_counted, req.prompt_done)
        if msg.done >= msg.total:
            self.places.unline(req)
        if self.places.parked:  # one postponed max_wait_s resumes at the next line, not at the next token
            self.admission.dispatch()
        if self.places.line:
            self.admission.offer_boundary()

    def _on_token(self, req: Request, msg: m.Token) -> None:
        if req.first_token_at is None:
            req.first_token_at = self.clock()
            self.metrics.ttft.observe(req.ttft_s)
        self.places.unline(req)
        req.output.append(msg.token)
        self.metrics.generated_tokens.inc()
        if self.places.parked:  # one postponed max_wait_s by a long answer resumes without waiting for its end
            self.admission.dispatch()

    def _on_embedding(self, req: Request, msg: m.Embedding) -> None:
        """An embed request's vector (its DONE follows): its read is over, as a first token says of others'."""
        self.places.unline(req)
        if self.places.parked:
            self.admission.dispatch()

    def _on_suspended(self, req: Request, msg: m.Suspended) -> None:
        # a parked read's blocks can be moved out on demand: a request deferred for memory may fit now
        # (and if nothing else runs, no DONE would ever come to let it in)
        self.admission.memory_full = False
        self.places.park(req)
        self.metrics.preemptions.inc()
        self.admission.dispatch()
        self.admission.offer_boundary()

    def _on_decline(self, req: Request, msg: m.Decline) -> None:
        self.metrics.declined.labels(msg.reason).inc()

    def on_end(self, req: Request, msg: m.Done | m.Err) -> None:
        self.admission.memory_full = False  # its blocks are free: deferred requests may go in
        self.places.leave(req)
        self.places.unpark(req)
        if isinstance(msg, m.Done) and req.restarts:
            self.metrics.engine_death_requests.labels("recovered").inc()
        if isinstance(msg, m.Done) and "drafted" in msg.extra:  # speculative decoding's counts
            self.metrics.observe_speculation(int(msg.extra["drafted"]), int(msg.extra["accepted"]))
        self.places.end(req)
        self.admission.dispatch()
        self.admission.offer_boundary()

    _HANDLERS = {m.Info: _on_info, m.PromptProgress: _on_pp, m.Token: _on_token, m.Embedding: _on_embedding,
                 m.Suspended: _on_suspended, m.Decline: _on_decline, m.Defer: _on_defer, m.Done: on_end, m.Err: on_end}
