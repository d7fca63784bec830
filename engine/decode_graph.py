"""Decode steps on the GPU as CUDA graph replays: the whole step (every layer's kernels and GEMMs)
is captured once and replayed per token, so a step costs the GPU's time, not Python's launches.

One graph per context bucket (1024, 2048, 4096, ... keys): the decoding attention's grid covers
the bucket, its blocks past the present keys return at once. Everything a graph reads or writes
sits at a fixed address: the token and the position are device buffers set before each replay,
the KV cache is the engine's, and the step's temporaries come from a memory pool of the graphs'
own (filled by an eager run of the same step before capture, so that capture allocates nothing).
The model code does not know graphs exist.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass

import numpy as np

from engine.backend import Backend, Step
from engine.kv import KVCache

MIN_BUCKET = 1024


def bucket(pos: int, ctx: int) -> int:
    """The graph a step at `pos` replays: the smallest power-of-two key count from MIN_BUCKET that
    covers pos + 1 keys, at most the context."""
    size = MIN_BUCKET
    while size < pos + 1:
        size *= 2
    return min(size, ctx)


@dataclass
class CapturedStep:
    graph: object
    step: Step  # its device position buffer
    logits: object  # (vocab,) fp32 on the device, written by each replay
    argmax: object  # (1,) int64 on the device: the logits' first maximum (the greedy token)


class GraphDecoder:
    def __init__(self, model, kv: KVCache, backend: Backend):
        cp = backend.xp
        self.model, self.kv, self.backend, self.cp = model, kv, backend, cp
        model.rope_tables(0, kv.ctx)  # sized once: a capture must not grow them
        self.token = cp.zeros(1, dtype=cp.int64)
        self.stream = cp.cuda.Stream(non_blocking=True)
        self.pool = cp.cuda.MemoryPool()
        self.captured: dict[int, CapturedStep] = {}
        self.last: CapturedStep | None = None  # the graph the latest logits came from

    def bucket(self, pos: int) -> int:
        return bucket(pos, self.kv.ctx)

    def decode(self, token: int, pos: int):
        """Logits (vocab,) float32 on the device after `token` at position `pos` (its K/V row
        written); the graph's own output buffer, valid until the next replay."""
        self.backend.synchronize()  # prompt work ran on the default stream
        entry = self.captured.get(self.bucket(pos))
        if entry is None:
            with self.stream:
                self.token.set(np.array([token], dtype=np.int64))
                return self.capture(self.bucket(pos), pos)
        self.replay(entry, token, pos)
        self.stream.synchronize()  # the sampler reads the logits on the default stream
        self.last = entry
        return entry.logits

    def owns(self, logits) -> bool:
        """Whether `logits` are the latest replay's output buffer (a fixed address)."""
        return self.last is not None and logits is self.last.logits

    def greedy_token(self) -> int:
        """The argmax the latest replay computed with its logits (8 bytes copied, no reduction
        launched)."""
        return int(self.last.argmax.get()[0])

    def replay(self, entry: CapturedStep, token: int, pos: int) -> None:
        """Set the step's token and position and launch its graph on the decoder's stream (no wait)."""
        with self.stream:
            self.token.set(np.array([token], dtype=np.int64))
            entry.step.set_position(pos)
            entry.graph.launch(self.stream)

    def capture(self, size: int, pos: int):
        """Run this step eagerly (its result is returned, and it fills the pool), then capture it."""
        cp, kernels = self.cp, self.backend.kernels
        step = kernels.static_step(1, size)
        step.set_position(pos)
        with cp.cuda.using_allocator(self.pool.malloc):
            logits = self.model.forward_on_device(self.token, step, self.kv, True)
            kernels.argmax(logits)
            self.stream.synchronize()
            self.stream.begin_capture()
            try:
                out = self.model.forward_on_device(self.token, step, self.kv, True)
                argmax = kernels.argmax(out)
            finally:
                graph = self.stream.end_capture()
        self.captured[size] = CapturedStep(graph, step, out, argmax)
        self.last = None  # the logits returned here are the eager run's
        print(f"strata: captured the decode step for up to {size} positions", file=sys.stderr, flush=True)
        return logits
