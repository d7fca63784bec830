"""One engine's faults, seen from the queue: its death, its restarts running out, a line that does
not parse.

Engine death loses no request: the running and the parked requests go back to the front of the
queue (in arrival order) and run again on the restarted engine; one that had tokens continues
from its prompt plus those tokens. A request blamed for `max_retries` deaths is taken for their
cause (a poison request) and fails: the read in front is blamed (its chunk was running), else the
decoding requests.
"""
from __future__ import annotations

import logging
import re

from protocol import messages as m

from serve.scheduling.admission import Admission
from serve.scheduling.engine_lines import EngineLines
from serve.scheduling.metrics import Metrics
from serve.scheduling.places import Places
from serve.scheduling.pool_report import PoolReport
from serve.scheduling.request import EngineFailure, Phase, Request

log = logging.getLogger("strata.scheduler")


class Recovery:
    def __init__(self, places: Places, admission: Admission, lines: EngineLines, report: PoolReport,
                 metrics: Metrics, max_retries: int, eos_ids: frozenset[int]):
        self.places, self.admission, self.lines, self.report = places, admission, lines, report
        self.metrics, self.max_retries, self.eos_ids = metrics, max_retries, eos_ids

    def on_engine_exit(self, reason: str, blame: bool = True) -> None:
        """What the engine held goes back to the front of the queue, to run on the restarted
        engine (dispatched when it is ready). Blamed once: the read in front if there was one (the
        engine was reading its chunk), else every decoding request (they were stepped together); none
        where the engine said why (blame False: it ran out of memory, and takes fewer requests now: two such
        deaths in a row had failed the read in front at both as a poison request)."""
        self.metrics.engine_restarts.inc()
        self.admission.memory_full = False
        self.report.engine_gone()
        places = self.places
        parked = list(places.parked)
        for req in (places.line[:1] if places.line else places.running) if blame else ():
            req.deaths_running += 1
        running = places.take_running()
        for req in parked:
            places.unpark(req)
        held = sorted(running + parked, key=lambda r: r.arrived)
        places.waiting.extendleft(reversed([r for r in held if self._survives(r, reason)]))

    def _survives(self, req: Request, reason: str) -> bool:
        req.restarts += 1
        if req.abandoned:  # nobody waits for it any more
            self.places.end(req)
            return False
        if req.deaths_running >= self.max_retries:
            self.metrics.engine_death_requests.labels("failed").inc()
            log.error("request %d was running at %d engine deaths: failing it as their likely cause",
                      req.id, req.deaths_running)
            self.places.end(req)
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
            self.lines.on_end(req, done)
            req.deliver(done)
        return finish is not None

    def on_engine_failed(self) -> None:
        """Restarts are exhausted: nobody waiting can be served."""
        waiting = self.places.waiting
        while waiting:
            req = waiting.popleft()
            req.deliver(EngineFailure(f"the engine is unavailable: {self.admission.engine.failure}"))
            self.places.forget(req)

    def on_malformed(self, line: str, error: str) -> None:
        """A line that does not parse fails the request it names (else the read in front, else the
        first running one); the engine is told to stop it."""
        named = re.search(r" id=([0-9]+)\s*$", line)
        req = self.places.requests.get(int(named.group(1))) if named else None
        req = req or self.places.front
        if req is None or req.phase is not Phase.RUNNING:
            return
        req.deliver(EngineFailure(f"the engine sent a malformed line ({error})", status=502))
        self.admission.abandon(req)  # STOP it; its blocks go at its DONE
