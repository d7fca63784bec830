"""Temperature draws on the GPU as CUDA graph replays.

sampler.draw_index runs a draw as ~20 array operations (a radix sort of the vocabulary, exp,
cumulative sums, searches); launched one by one from Python they cost over a millisecond per
token, most of it the host's. Here each (logits buffer, temperature, top-k, top-p, min-p) gets the
draw captured once as a graph whose only input that changes is the uniform u, a device scalar set
before each replay; 8 bytes (the token) come back. The logits buffer is a decode graph's own
output, so its address is fixed. A draw the driver refuses to capture falls back to launching it
(the same operations, the same token).
"""
from __future__ import annotations

import sys
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from engine.sampler import SamplingParams, draw_index

MAX_GRAPHS = 16  # captured draws kept (least recently used go): one per parameter set in use


@dataclass
class CapturedDraw:
    graph: object
    u: object  # () float64 on the device: the uniform of the next replay
    token: object  # () int64 on the device: the draw's token


class DrawGraphs:
    def __init__(self, cp):
        self.cp = cp
        self.stream = cp.cuda.Stream(non_blocking=True)
        self.pool = cp.cuda.MemoryPool()
        self.graphs: OrderedDict[tuple, CapturedDraw] = OrderedDict()
        self.capturable = True

    def draw(self, logits, u: float, p: SamplingParams) -> int:
        """The token pick_sorted(cupy, logits / temperature, u, p) gives, by a graph replay."""
        key = (logits.data.ptr, logits.shape[0], p.temperature, p.top_k, p.top_p, p.min_p)
        entry = self.graphs.get(key)
        if entry is None and self.capturable:
            entry = self.capture(key, logits, p)
        if entry is None:
            return int(draw_index(self.cp, scaled(logits, p), u, p))
        self.graphs.move_to_end(key)
        with self.stream:
            entry.u.set(np.array(u, dtype=np.float64))
            entry.graph.launch(self.stream)
            return int(entry.token.get(stream=self.stream))

    def capture(self, key: tuple, logits, p: SamplingParams) -> CapturedDraw | None:
        cp = self.cp
        try:
            with cp.cuda.using_allocator(self.pool.malloc), self.stream:
                u = cp.zeros((), dtype=cp.float64)
                draw_index(cp, scaled(logits, p), u, p)  # fills the pool: the capture allocates nothing new
                self.stream.synchronize()
                self.stream.begin_capture()
                try:
                    token = draw_index(cp, scaled(logits, p), u, p)
                finally:
                    graph = self.stream.end_capture()
        except Exception as e:  # an operation the driver or CuPy will not capture: launch draws instead
            print(f"strata: sampling graphs unavailable ({type(e).__name__}: {e}); drawing eagerly",
                  file=sys.stderr, flush=True)
            self.capturable = False
            return None
        self.graphs[key] = CapturedDraw(graph, u, token)
        if len(self.graphs) > MAX_GRAPHS:
            self.graphs.popitem(last=False)
        return self.graphs[key]


def scaled(logits, p: SamplingParams):
    """Logits over the temperature, as Sampler.sample divides them (a new array)."""
    return logits.astype(np.float32, copy=False) / np.float32(p.temperature)
