"""A line on stderr per engine step when $STRATA_STEP_TRACE is set (to anything but 0): what ran and how
long, so that a request's time to first token can be taken apart (bench runs on the device read the
server's log, where the engine's stderr goes). Off by default: no cost."""
from __future__ import annotations

import json
import os
import sys
import time


class StepTrace:
    def __init__(self, enabled: bool | None = None):
        self.enabled = os.environ.get("STRATA_STEP_TRACE", "0") != "0" if enabled is None else enabled
        self.origin = time.perf_counter()

    def step(self, kind: str, started: float, **fields) -> None:
        """kind: prompt, decode, draft (a draft model's run), draws (a decode step's tokens drawn and written, its
        rows' blocks had) or ahead (host-tier copies made ahead); started: its perf_counter at the start."""
        if not self.enabled:
            return
        now = time.perf_counter()
        line = {"t": round(started - self.origin, 4), "ms": round((now - started) * 1000, 2), "kind": kind} | fields
        print("strata-trace " + json.dumps(line), file=sys.stderr, flush=True)

    def event(self, kind: str, **fields) -> None:
        """A moment, not a step (kind gen: a request taken in), at its time."""
        if self.enabled:
            self.step(kind, time.perf_counter(), **fields)
