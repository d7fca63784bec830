"""The decode graphs an idle engine captures before their first use (engine/runner/decode_graph.py capture_ahead).

A decode step whose batch size and context bucket has no graph yet is captured in that step (~50 ms on the 8B shape:
an eager run, then the capture), and every request in it waits: 16 sub-agents met four such within three runs
(bench/HISTORY.md, fifteenth session). When no request is in the engine and no line has come for IDLE_S, the loop
captures one graph at a time, the likeliest first, until those worth it are there; a GEN that comes meanwhile waits
for the capture in hand at most. Not with an expert cache (its misses are filled after a step from the step's routes,
which padding rows would add to), nor where a capture fails (said once; the graphs before it stay).
"""
from __future__ import annotations

import sys

from engine.runner.graph_pool import GraphMemoryError

IDLE_S = 0.05  # the quiet before each capture


class AheadCaptures:
    def __init__(self, runner):
        self.runner = runner
        self.stopped = bool(runner.expert_caches)

    def pending(self) -> bool:
        decoder = self.runner.decoder  # (None on the CPU, in the mock, and after a capture the driver refused)
        return not self.stopped and decoder is not None and bool(decoder.ahead(self.runner.max_running))

    def capture_one(self) -> None:
        try:
            self.runner.decoder.capture_ahead(self.runner.max_running)
        except GraphMemoryError as e:
            self.stop(f"{e}; no more decode graphs are captured ahead of their use")
        except Exception as e:  # the step's own capture will say what it meets
            self.stop(f"a decode graph captured ahead of its use failed ({type(e).__name__}: {e}); no more are")

    def stop(self, said: str) -> None:
        self.stopped = True
        print(f"strata: {said}", file=sys.stderr, flush=True)
