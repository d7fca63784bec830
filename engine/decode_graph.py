"""Decode steps on the GPU as CUDA graph replays: the whole step (every layer's kernels and GEMMs)
is captured once and replayed per token, so a step costs the GPU's time, not Python's launches.

One graph per batch size and context bucket (1024, 2048, 4096, ... keys): the decoding attention's
grid covers the bucket, its blocks past a sequence's keys return at once. Everything a graph reads
or writes sits at a fixed address: the tokens, positions and block tables are device buffers set
before each replay (each table padded to the bucket's blocks), the KV pool is the engine's, and the
step's temporaries come from a memory pool of the graphs' own (filled by an eager run of the same
step before capture, so that capture allocates nothing). That pool's memory is shared by the
graphs' temporaries, so whatever must outlive another graph's replay (a step's inputs, the eager
run's logits) is allocated outside it.
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
    step: Step  # its device positions and block tables, set before each replay
    tokens: object  # (rows,) int64 on the device: each row's input token, set before each replay
    logits: object  # (rows, vocab) fp32 on the device, written by each replay
    argmax: object  # (rows,) int64 on the device: each row's first maximum (its greedy token)


class GraphDecoder:
    """Decode steps of one or several sequences (each with its block table) as graph replays: one
    graph per (rows, bucket), rows the batch size and bucket the longest sequence's."""

    def __init__(self, model, kv: KVCache, backend: Backend):
        cp = backend.xp
        self.model, self.kv, self.backend, self.cp = model, kv, backend, cp
        model.rope_tables(0, kv.ctx)  # sized once: a capture must not grow them
        self.stream = cp.cuda.Stream(non_blocking=True)
        self.pool = cp.cuda.MemoryPool()
        self.captured: dict[tuple[int, int], CapturedStep] = {}
        self.last: CapturedStep | None = None  # the graph the latest logits came from
        self.greedy: np.ndarray | None = None  # the latest replay's argmax on the host, fetched once

    def bucket(self, pos: int) -> int:
        return bucket(pos, self.kv.ctx)

    def decode(self, tokens, tables, positions):
        """Logits (rows, vocab) float32 on the device after each row's token at its position, its
        rows through its block table (their K/V rows written); the graph's own output buffer, valid
        until the next replay, or the eager run's logits when this step was just captured."""
        self.backend.synchronize()  # prompt work ran on the default stream
        key = (len(tokens), self.bucket(max(positions)))
        entry = self.captured.get(key)
        if entry is None:
            return self.capture(key, tokens, tables, positions)
        self.replay(entry, tokens, tables, positions)
        self.stream.synchronize()  # the sampler reads the logits on the default stream
        self.last, self.greedy = entry, None
        return entry.logits

    def decode_one(self, token: int, pos: int, table=None):
        """One sequence's step: logits (vocab,) on the device (a row of the graph's buffer); its
        table defaults to the pool's lone sequence (KVCache(cfg, ctx, backend) in tools), as wide as
        its rows (a graph's tables hold its bucket's blocks, not the context's)."""
        table = self.kv.lone_table(pos + 1) if table is None else table
        return self.decode([token], [table], [pos])[0]

    def entry(self, rows: int, pos: int) -> CapturedStep | None:
        return self.captured.get((rows, self.bucket(pos)))

    def replay(self, entry: CapturedStep, tokens, tables, positions) -> None:
        """Set the step's tokens, positions and tables and launch its graph on the decoder's stream (no wait)."""
        with self.stream:
            entry.tokens.set(np.asarray(tokens, dtype=np.int64))
            entry.step.set_rows(tables, positions)
            entry.graph.launch(self.stream)

    def owns(self, logits) -> bool:
        """Whether `logits` are (a row of) the latest replay's output buffer."""
        return self.last is not None and logits is not None and logits.base is self.last.logits

    def greedy_token(self, row: int = 0) -> int:
        """The argmax the latest replay computed for `row` (the whole batch's 8 bytes a row come
        back once; no reduction launched)."""
        if self.greedy is None:
            self.greedy = self.last.argmax.get()
        return int(self.greedy[row])

    def capture(self, key: tuple[int, int], tokens, tables, positions):
        """Run this step eagerly (its result is returned, and it fills the pool), then capture it."""
        cp, kernels = self.cp, self.backend.kernels
        rows, size = key
        # the step's inputs (tokens, positions, tables and their offsets) live outside the graphs'
        # pool: a graph's temporaries go back to that pool after its capture and a later capture
        # reuses them, so anything that must outlive a replay of another graph is allocated apart
        step = kernels.batch_step(tables, positions, max_keys=size, block=self.kv.block_size)
        buf = cp.asarray(np.asarray(tokens, dtype=np.int64))
        kv_rows = self.kv.rows(*tables)
        self.backend.synchronize()
        with cp.cuda.using_allocator(self.pool.malloc), self.stream:
            logits = self.model.forward_on_device(buf, step, kv_rows, True)
            kernels.argmax(logits)
            self.stream.synchronize()
            self.stream.begin_capture()
            kernels.dependent = kernels.pdl  # each kernel may start while the one before it finishes (launch.py)
            try:
                out = self.model.forward_on_device(buf, step, kv_rows, True)
                argmax = kernels.argmax(out)
            finally:
                kernels.dependent = False
                graph = self.stream.end_capture()
        self.captured[key] = CapturedStep(graph, step, buf, out, argmax)
        self.last = None  # the logits returned here are the eager run's, copied out of the graphs' pool
        logits = logits.copy()
        print(f"strata: captured the decode step of {rows} sequence{'s' if rows > 1 else ''} for up to {size} "
              "positions", file=sys.stderr, flush=True)
        return logits
