"""Decode steps on the GPU as CUDA graph replays: the whole step (every layer's kernels and GEMMs)
is captured once and replayed per token, so a step costs the GPU's time, not Python's launches.

One graph per batch size and context bucket (1024, 2048, 4096, ... keys): the decoding attention's
grid covers the bucket, its blocks past a sequence's keys return at once. Batch sizes come from a
short list (BATCH_SIZES, as vLLM's capture sizes): a step of n rows replays the smallest captured
size that holds them, its extra rows padding (token 0 at position 0 of a block no request owns, their
logits ignored). Rows are batch-invariant (each row's result is its result alone), so padding changes
no real row's numbers, and a load that passes through every batch size captures a dozen graphs per
bucket, not one per size.

Everything a graph reads or writes sits at a fixed address: the tokens, positions and block tables
are device buffers set before each replay (each table padded to the bucket's blocks), the KV pool is
the engine's, the logits and greedy picks go to one buffer shared by every graph (only one replay's
are ever read), and the step's temporaries come from a memory pool of the graphs' own
(engine/runner/graph_pool.py: never given back while graphs exist), filled by an eager run of the same
step before capture, so that capture allocates nothing. The temporaries are shared by all graphs,
so whatever must outlive another graph's replay (a step's inputs, the eager run's logits) is
allocated outside that pool. The model code does not know graphs exist.
"""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

from engine.ops.backend import Backend
from engine.core.step import Step
from engine.runner.graph_pool import GraphMemoryError, graph_memory_pool
from engine.kvcache.kv import KVCache

MIN_BUCKET = 1024


def bucket(pos: int, ctx: int) -> int:
    """The graph a step at `pos` replays: the smallest power-of-two key count from MIN_BUCKET that
    covers pos + 1 keys, at most the context."""
    size = MIN_BUCKET
    while size < pos + 1:
        size *= 2
    return min(size, ctx)


BATCH_SIZES = (1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64)  # captured batch sizes (up to MAX_BATCH, engine/runner/runner.py)
AHEAD_ROWS, AHEAD_KEYS = 16, 8192  # the graphs captured ahead of their first use while the engine is idle: batch
# sizes up to AHEAD_ROWS at buckets up to AHEAD_KEYS (20 graphs, ~1 s of idle time, their temporaries a few MiB)


def padded_rows(rows: int) -> int:
    """The captured batch size a step of `rows` rows replays."""
    return next(size for size in BATCH_SIZES if size >= rows)


@dataclass
class CapturedStep:
    graph: object
    step: Step  # its device positions and block tables, set before each replay
    tokens: object  # (rows,) int64 on the device: each row's input token, set before each replay


class GraphDecoder:
    """Decode steps of one or several sequences (each with its block table) as graph replays: one
    graph per (batch size, bucket), the batch size padded up to BATCH_SIZES and the bucket the
    longest sequence's. `pad_block`: a KV block no sequence owns, which padding rows write into;
    without one (tools' one-sequence pools) every batch size is captured as it comes."""

    def __init__(self, model, kv: KVCache, backend: Backend, pad_block: int | None = None, pad_state=None):
        """pad_state: a hybrid's recurrent state (SequenceState) no request owns, which padding rows advance."""
        cp = backend.xp
        self.model, self.kv, self.backend, self.cp, self.pad_block = model, kv, backend, cp, pad_block
        self.pad_state = pad_state
        model.rope_tables(kv.ctx)  # sized once: a capture must not grow them
        self.stream = cp.cuda.Stream(non_blocking=True)
        self.pool = graph_memory_pool(cp)
        self.captured: dict[tuple[int, int], CapturedStep] = {}
        self.capture_s = 0.0  # time spent capturing, for the log
        rows = BATCH_SIZES[-1]
        # every graph's outputs, outside the graphs' pool (the default allocator's)
        self.logits = cp.empty((rows, model.cfg.vocab_size), dtype=cp.float32)  # (rows, vocab)
        self.argmax = cp.empty(rows, dtype=cp.int64)  # (rows,): each row's first maximum (its greedy token)
        self.replayed = False  # whether self.logits holds the latest decode's rows (else an eager run's)
        self.greedy: np.ndarray | None = None  # the latest replay's argmax on the host, fetched once

    def bucket(self, pos: int) -> int:
        return bucket(pos, self.kv.ctx)

    def size(self, rows: int) -> int:
        return padded_rows(rows) if self.pad_block is not None else rows

    def decode(self, tokens, tables, positions, states=(), meanwhile: Callable[[object], None] | None = None):
        """Logits (rows, vocab) float32 on the device after each row's token at its position, its
        rows through its block table (their K/V rows written; a hybrid's row i advancing states[i]): rows of
        the graphs' shared output buffer, valid until the next replay, or the eager run's logits when this
        step was just captured. GraphMemoryError when a capture does not fit (the graphs before it stay
        usable). meanwhile(logits): called once the replay is launched, before the wait for it (after a capture),
        on the stream that computes them: work queued there follows the step, and is waited for with it."""
        self.backend.synchronize()  # prompt work ran on the default stream
        rows = len(tokens)
        key = (self.size(rows), self.bucket(max(positions)))
        entry = self.captured.get(key)
        tokens, tables, positions, states = self.padded(key[0], tokens, tables, positions, states)
        if entry is None:  # (the capture's eager run has computed them)
            logits = self.capture(key, tokens, tables, positions, states)[:rows]
        else:
            self.replay(entry, tokens, tables, positions, states)
            logits = self.logits
        if meanwhile is not None:  # the host's work while the device runs the step
            with self.stream:
                meanwhile(logits)
        if entry is None:
            return logits
        self.stream.synchronize()  # the sampler reads the logits on the default stream
        self.replayed, self.greedy = True, None
        return self.logits[:rows]

    def padded(self, size: int, tokens, tables, positions, states=()):
        """A step's rows with padding rows up to `size`: token 0 at position 0 of the pad block (a hybrid's
        padding rows advancing the pad state)."""
        pad = size - len(tokens)
        if pad <= 0:
            return list(tokens), list(tables), list(positions), list(states)
        return ([*tokens, *[0] * pad], [*tables, *[[self.pad_block]] * pad], [*positions, *[0] * pad],
                [*states, *[self.pad_state] * pad] if states else [])

    def ahead(self, max_rows: int) -> list[tuple[int, int]]:
        """The (batch size, bucket) graphs not yet captured that capture_ahead would take, in its order: smaller
        buckets first, smaller batches first within one; none without a pad block (every row is a request's)."""
        if self.pad_block is None:
            return []
        doublings = (AHEAD_KEYS // MIN_BUCKET).bit_length()
        buckets = sorted({bucket((MIN_BUCKET << i) - 1, self.kv.ctx) for i in range(doublings)})  # (at most ctx)
        sizes = [size for size in BATCH_SIZES if size <= min(AHEAD_ROWS, max_rows)]
        return [(size, keys) for keys in buckets for size in sizes if (size, keys) not in self.captured]

    def capture_ahead(self, max_rows: int) -> None:
        """Capture the first graph of ahead(max_rows) (there is one), its rows all padding (token 0 at position 0 of
        the pad block, a hybrid's advancing the pad state): the first step of that batch size and bucket then replays
        it, where its capture held every request in the step ~50 ms (16 sub-agents met four within three runs:
        bench/HISTORY.md, fifteenth session). GraphMemoryError where it does not fit (those before it stay)."""
        size, bucket_keys = self.ahead(max_rows)[0]
        states = [self.pad_state] * size if self.pad_state is not None else []
        self.backend.synchronize()
        self.capture((size, bucket_keys), [0] * size, [[self.pad_block]] * size, [0] * size, states)

    def decode_one(self, token: int, pos: int, table=None):
        """One sequence's step: logits (vocab,) on the device (a row of the graph's buffer); its
        table defaults to the pool's lone sequence (KVCache(cfg, ctx, backend) in tools), as wide as
        its rows (a graph's tables hold its bucket's blocks, not the context's)."""
        table = self.kv.lone_table(pos + 1) if table is None else table
        return self.decode([token], [table], [pos])[0]

    def entry(self, rows: int, pos: int) -> CapturedStep | None:
        return self.captured.get((self.size(rows), self.bucket(pos)))

    def replay(self, entry: CapturedStep, tokens, tables, positions, states=()) -> None:
        """Set the step's tokens, positions, tables and (a hybrid's) states, padded to the graph's rows, and
        launch its graph on the decoder's stream (no wait)."""
        tokens, tables, positions, states = self.padded(entry.step.n, tokens, tables, positions, states)
        with self.stream:
            entry.tokens.set(np.asarray(tokens, dtype=np.int64))
            entry.step.set_rows(tables, positions)
            if entry.step.states is not None:
                self.backend.kernels.set_states(entry.step.states, states)
            entry.graph.launch(self.stream)

    def owns(self, logits) -> bool:
        """Whether `logits` are (a row of) the latest replay's output buffer."""
        if not self.replayed or logits is None:
            return False
        start = self.logits.data.ptr
        return start <= logits.data.ptr < start + self.logits.nbytes

    def greedy_token(self, row: int = 0) -> int:
        """The argmax the latest replay computed for `row` (the whole batch's 8 bytes a row come
        back once; no reduction launched)."""
        if self.greedy is None:
            self.greedy = self.argmax.get()
        return int(self.greedy[row])

    def capture(self, key: tuple[int, int], tokens, tables, positions, states=()):
        """Run this step eagerly (its result is returned, and it fills the pool), then capture it;
        the graph ends by copying its logits and argmax into the shared outputs."""
        cp, kernels = self.cp, self.backend.kernels
        rows, size = key
        began = time.perf_counter()
        # the step's inputs (tokens, positions, tables and their offsets) live outside the graphs'
        # pool: a graph's temporaries go back to that pool after its capture and a later capture
        # reuses them, so anything that must outlive a replay of another graph is allocated apart
        step = kernels.batch_step(tables, positions, max_keys=size, block=self.kv.block_size)
        if states:  # a hybrid's: the rows' recurrent states by address, set before each replay
            step.states = kernels.state_slots(len(states))
            kernels.set_states(step.states, states)
        buf = cp.asarray(np.asarray(tokens, dtype=np.int64))
        kv_rows = self.kv.rows(*tables)
        self.backend.synchronize()
        with cp.cuda.using_allocator(self.pool.malloc), self.stream:
            logits = self.model.forward_on_device(buf, step, kv_rows, True)
            self.logits[:rows] = logits  # the copies the graph ends with, run once before capture
            self.argmax[:rows] = kernels.argmax(logits)
            self.stream.synchronize()
            self.stream.begin_capture()
            kernels.dependent = kernels.pdl  # each kernel may start while the one before it finishes (launch.py)
            try:
                out = self.model.forward_on_device(buf, step, kv_rows, True)
                self.logits[:rows] = out
                self.argmax[:rows] = kernels.argmax(out)
            finally:
                kernels.dependent = False
                graph = self.stream.end_capture()
        with self.stream:  # the eager run's logits, copied out of the graphs' pool (the next capture reuses it)
            logits = logits.copy()
            self.stream.synchronize()
        self.captured[key] = CapturedStep(graph, step, buf)
        self.replayed = False  # the logits returned here are the eager run's
        self.capture_s += time.perf_counter() - began
        print(f"strata: captured the decode step of {rows} sequence{'s' if rows > 1 else ''} for up to {size} "
              f"positions in {time.perf_counter() - began:.2f} s ({len(self.captured)} graphs, "
              f"{self.capture_s:.1f} s in all)", file=sys.stderr, flush=True)
        return logits


def decode_or_eager(decoder: GraphDecoder | None, model, kv: KVCache, tokens: list[int], tables: list[list[int]],
                    positions: list[int], states=(), meanwhile: Callable[[object], None] | None = None):
    """A decode step through `decoder`'s graphs, or eagerly (model.forward_batch) without one -> (logits (rows,
    vocab) on the device, the decoder to use from now on). A step of more rows than the graphs hold (BATCH_SIZES'
    largest: their output buffer's) and one whose graph does not fit the device run eagerly; a capture the driver
    refuses leaves the graphs off (None) from now on. A hybrid's failed capture raises: its states may have moved in
    the capture's eager run (the engine stops; the server restarts it and reads its requests again).
    meanwhile(logits): the work to do while the device runs the step (GraphDecoder.decode; after an eager step: it has
    run), called once, or again where a graph's step fails after calling it (with the logits that stand then)."""
    if decoder is not None and len(tokens) <= BATCH_SIZES[-1]:
        try:
            return decoder.decode(tokens, tables, positions, states, meanwhile), decoder
        except GraphMemoryError as e:  # this batch size's graph does not fit: this step eagerly
            if states:
                raise
            print(f"strata: {e}; this decode step runs eagerly", file=sys.stderr, flush=True)
        except Exception as e:
            if states:
                raise
            print(f"strata: CUDA graph decode unavailable ({type(e).__name__}: {e}); decoding eagerly",
                  file=sys.stderr, flush=True)
            decoder = None
    logits = model.forward_batch(np.asarray(tokens, dtype=np.int64), tables, positions, kv, tuple(states))
    if meanwhile is not None:
        meanwhile(logits)
    return logits, decoder
