"""Sampling on the GPU as CUDA graph replays.

A temperature draw (sampler.draw_index) is ~20 array operations: a radix sort of the vocabulary,
exp, cumulative sums, searches; the penalties add a gather and a scatter. Launched one by one from
Python they cost over a millisecond per token, most of it the host's. Here each (logits buffer,
sampling parameters) gets the whole pick captured once as a graph: the penalties into a copy of
the logits, then the draw (or, at temperature 0, the argmax). What changes between tokens is set
into device buffers before each replay: the uniform u, and the recent tokens with their counts
(padded to the penalty window with a sink slot past the vocabulary). 8 bytes (the token) come
back. A grammar's mask (engine/runner/grammar_mask.py: a bit a token, 4 KiB on a 128K vocabulary) is one more
such buffer, applied after the penalties, so a constrained pick stays on the device too. The logits
buffer is a decode graph's own output, so its address is fixed. A pick the driver refuses to
capture falls back to launching it (the same operations, the same token).
"""
from __future__ import annotations

import sys
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from engine.runner.graph_pool import GraphMemoryError, graph_memory_pool
from engine.runner.sampler import SamplingParams, allowed_tokens, draw_index, penalize, scale

MAX_GRAPHS = 128  # captured picks kept (least recently used go): one per (row, parameter set) in use, so
# that 64 sampling requests' rows of the decode graphs' shared logits do not evict each other every step


@dataclass
class CapturedDraw:
    graph: object
    u: object  # () float64: the uniform of the next replay
    ids: object | None  # (window,) int64: recent tokens, padded with the sink index (the vocabulary size)
    freq: object | None  # (window,) float32: their counts, 0 in the padding
    token: object  # () int64: the pick
    mask: object | None  # (ceil(vocab / 32),) uint32: the grammar's mask of the next pick, or None


class DrawGraphs:
    def __init__(self, cp):
        self.cp = cp
        self.stream = cp.cuda.Stream(non_blocking=True)
        self.pool = graph_memory_pool(cp)  # engine/runner/graph_pool.py: never freed under the graphs
        self.graphs: OrderedDict[tuple, CapturedDraw] = OrderedDict()
        self.capturable = True

    def draw(self, logits, u: float | None, p: SamplingParams, counts: tuple | None = None, mask=None) -> int:
        """The token Sampler.sample gives over cupy without graphs: logits (vocab,) fp32 on the
        device, u the uniform (None at temperature 0), counts the penalties' (ids, freq) or None,
        mask a grammar's mask words on the host or None."""
        window = max(1, p.repeat_last_n) if counts is not None else 0
        penalties = (p.repeat_penalty, p.presence_penalty, p.frequency_penalty) if window else None
        key = (logits.data.ptr, logits.shape[0], p.temperature, p.top_k, p.top_p, p.min_p, window, penalties,
               mask is not None)
        entry = self.graphs.get(key)
        if entry is None and self.capturable:
            entry = self.capture(key, logits, p, window, mask is not None)
        if entry is None:
            return self.launch(logits, u, p, counts, mask)
        self.graphs.move_to_end(key)
        with self.stream:
            if u is not None:
                entry.u.set(np.array(u, dtype=np.float64))
            if window:
                ids, freq = padded(counts, window, logits.shape[0])
                entry.ids.set(ids)
                entry.freq.set(freq)
            if mask is not None:
                entry.mask.set(mask)
            entry.graph.launch(self.stream)
            return int(entry.token.get(stream=self.stream))

    def launch(self, logits, u, p: SamplingParams, counts, mask) -> int:
        cp = self.cp
        ids, freq = (None, None) if counts is None else (cp.asarray(counts[0]), cp.asarray(counts[1]))
        return int(pick_on_device(cp, logits, cp.asarray(u if u is not None else 0.0), ids, freq, p,
                                  None if mask is None else cp.asarray(mask)))

    def capture(self, key: tuple, logits, p: SamplingParams, window: int, masked: bool) -> CapturedDraw | None:
        cp = self.cp
        try:
            with cp.cuda.using_allocator(self.pool.malloc), self.stream:
                u = cp.zeros((), dtype=cp.float64)
                ids = cp.full(window, logits.shape[0], dtype=cp.int64) if window else None
                freq = cp.zeros(window, dtype=cp.float32) if window else None
                mask = cp.full(-(-logits.shape[0] // 32), 0xFFFFFFFF, dtype=cp.uint32) if masked else None
                pick_on_device(cp, logits, u, ids, freq, p, mask)  # fills the pool: the capture allocates nothing new
                self.stream.synchronize()
                self.stream.begin_capture()
                try:
                    token = pick_on_device(cp, logits, u, ids, freq, p, mask)
                finally:
                    graph = self.stream.end_capture()
        except GraphMemoryError:  # no room for this one now: launch this pick, try again next time
            return None
        except Exception as e:  # an operation the driver or CuPy will not capture: launch picks instead
            print(f"strata: sampling graphs unavailable ({type(e).__name__}: {e}); sampling with launches",
                  file=sys.stderr, flush=True)
            self.capturable = False
            return None
        self.graphs[key] = CapturedDraw(graph, u, ids, freq, token, mask)
        if len(self.graphs) > MAX_GRAPHS:
            self.graphs.popitem(last=False)
        return self.graphs[key]


def pick_on_device(cp, logits, u, ids, freq, p: SamplingParams, mask=None):
    """The pick as a 0-d device array: penalties (when ids is given) into a copy of the logits with a
    sink slot at the end for the padding, the grammar's mask (when given: forbidden tokens to -inf),
    then the argmax or the draw. The same steps as Sampler.sample on the host."""
    if ids is not None:
        work = cp.zeros(logits.shape[0] + 1, dtype=cp.float32)
        work[:-1] = logits
        penalize(cp, work, ids, freq, p)
        logits = work[:-1]
    if mask is not None:
        logits = cp.where(allowed_tokens(cp, mask, logits.shape[0]), logits, np.float32(-np.inf))
    if p.temperature == 0:
        return cp.argmax(logits)
    return draw_index(cp, scale(logits, p), u, p)


def padded(counts: tuple[np.ndarray, np.ndarray], window: int, sink: int) -> tuple[np.ndarray, np.ndarray]:
    """(ids, freq) padded to the window: extra ids point at the sink slot with a count of 0."""
    ids, freq = np.full(window, sink, dtype=np.int64), np.zeros(window, dtype=np.float32)
    ids[: len(counts[0])], freq[: len(counts[1])] = counts
    return ids, freq
