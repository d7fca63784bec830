"""Penalized or constrained picks on the GPU as CUDA graph replays (plain temperature draws go to
engine/runner/batch_draws.py, a step's rows at once; engine/runner/picks.py routes each request).

A temperature draw (sampler.draw_index) is ~20 array operations: a radix sort of the vocabulary,
exp, cumulative sums, searches; the penalties add a gather and a scatter. Launched one by one from
Python they cost over a millisecond per token, most of it the host's. Here each set of sampling
parameters gets the whole pick captured once as a graph: the penalties into a copy of the logits,
then the draw (or, at temperature 0, the argmax). The graph reads its logits from an input buffer of
its own, into which each pick first copies its row (a device-to-device copy of the vocabulary's
floats), so that one graph serves every row of a batch and every prompt's last row: keyed by the
logits' address, 64 sampling requests captured 64 graphs in their first steps (~50 ms each, the
server stalled meanwhile). What else changes between tokens is set into device buffers before each
replay: the uniform u, and the recent tokens with their counts (padded to the penalty window with a
sink slot past the vocabulary). 8 bytes (the token) come back. A grammar's mask
(engine/runner/grammar_mask.py: a bit a token, 4 KiB on a 128K vocabulary) is one more such buffer,
applied after the penalties, so a constrained pick stays on the device too. A pick the driver
refuses to capture falls back to launching it (the same operations, the same token).
"""
from __future__ import annotations

import sys
from collections import OrderedDict
from dataclasses import dataclass, replace

import numpy as np

from engine.runner.graph_pool import GraphMemoryError, graph_memory_pool
from engine.runner.sampler import SamplingParams, allowed_tokens, draw_index, penalize, scale

MAX_GRAPHS = 64  # captured picks kept (least recently used go): one per parameter set in use
# a pick of each kind (prepare): plain, top-p, min-p, top-k with both (draw_index's branches), penalized
WARM_PICKS = (SamplingParams(temperature=1.0), SamplingParams(temperature=1.0, top_p=0.9),
              SamplingParams(temperature=1.0, min_p=0.05), SamplingParams(temperature=1.0, top_k=40, top_p=0.9, min_p=0.05))


@dataclass
class CapturedDraw:
    graph: object
    logits: object  # (vocab,) float32: the row to pick from, copied in before each replay
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
        device (written on the current stream, which the pick waits for), u the uniform (None at
        temperature 0), counts the penalties' (ids, freq) or None, mask a grammar's mask words on the
        host or None."""
        logits = self.cp.ascontiguousarray(logits, dtype=self.cp.float32)  # (a no-op for the engine's rows)
        window = max(1, p.repeat_last_n) if counts is not None else 0
        penalties = (p.repeat_penalty, p.presence_penalty, p.frequency_penalty) if window else None
        key = (logits.shape[0], p.temperature, p.top_k, p.top_p, p.min_p, window, penalties, mask is not None)
        self.stream.wait_event(self.cp.cuda.get_current_stream().record())  # the logits are written
        entry = self.graphs.get(key)
        if entry is None and self.capturable:
            entry = self.capture(key, logits.shape[0], p, window, mask is not None)
        if entry is None:
            return self.launch(logits, u, p, counts, mask)
        self.graphs.move_to_end(key)
        with self.stream:
            entry.logits.data.copy_from_device_async(logits.data, logits.nbytes, self.stream)
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

    def prepare(self, logits) -> None:
        """Every kind of pick once, greedy and drawn, penalized and masked, on logits (vocab,): CuPy
        compiles an array operation's kernel at its first use (seconds in all on a machine whose cache
        is empty), and the first request sampling one would stall every client while it did; done
        here, at start, once a machine."""
        vocab = logits.shape[0]
        counts = (np.arange(4, dtype=np.int64), np.ones(4, dtype=np.float32))
        mask = np.full(-(-vocab // 32), 0xFFFFFFFF, dtype=np.uint32)
        for p in WARM_PICKS:  # (plain temperature draws go to engine/runner/batch_draws.py: penalized ones come here)
            self.draw(logits, 0.5, replace(p, repeat_penalty=1.1), counts)
        self.draw(logits, None, SamplingParams(repeat_penalty=1.1, presence_penalty=0.1), counts, mask)
        self.draw(logits, 0.5, replace(WARM_PICKS[-1], repeat_penalty=1.1, frequency_penalty=0.1), counts, mask)

    def launch(self, logits, u, p: SamplingParams, counts, mask) -> int:
        cp = self.cp
        ids, freq = (None, None) if counts is None else (cp.asarray(counts[0]), cp.asarray(counts[1]))
        return int(pick_on_device(cp, logits, cp.asarray(u if u is not None else 0.0), ids, freq, p,
                                  None if mask is None else cp.asarray(mask)))

    def capture(self, key: tuple, vocab: int, p: SamplingParams, window: int, masked: bool) -> CapturedDraw | None:
        cp = self.cp
        try:
            with cp.cuda.using_allocator(self.pool.malloc), self.stream:
                logits = cp.zeros(vocab, dtype=cp.float32)  # the graph's input, held by its entry (as u is)
                u = cp.zeros((), dtype=cp.float64)
                ids = cp.full(window, vocab, dtype=cp.int64) if window else None
                freq = cp.zeros(window, dtype=cp.float32) if window else None
                mask = cp.full(-(-vocab // 32), 0xFFFFFFFF, dtype=cp.uint32) if masked else None
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
        self.graphs[key] = CapturedDraw(graph, logits, u, ids, freq, token, mask)
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
