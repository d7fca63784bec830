"""Temperature draws for a decode step's rows at once, on the GPU (argmax.cu's pick_keys and pick_draw).

A sampling row's pick used to be a graph replay of its own followed by a wait for its token
(engine/runner/sampling_graph.py): ~0.22 ms a row on an H200 (a radix sort of the vocabulary and a few
small kernels), one row after another, so 64 sampling clients spent ~14 ms of every ~33 ms decode period
drawing. Here every plain sampling row of a step (temperature > 0, no penalties, no grammar:
Sampler.batchable) is drawn in one graph replay and one copy back: the rows' logits copied into a
staging buffer, their parameters and uniforms in one transfer, then pick_keys, one radix sort of every
row's keys and pick_draw, a block a row. Where every row has 0 < top_k <= TOP_MAX (the servers' default top_k is
40), pick_top finds each row's top_k first keys instead of the sort (the same keys in the same order: the same
tokens), the sort having been most of a 64-row draw's ~1.6 ms on an H100.

A request takes each of its tokens from here, its first (after its prompt) as a batch of one, so that its
tokens come from the same arithmetic whatever the step: a row's token is a function of its logits, its
parameters and its uniform alone (argmax.cu). draw_segmented is that arithmetic in NumPy, the reference
tools/device/gpu_kernels_check.py holds the kernels to; the CPU engine draws with sampler.pick (a sorted
prefix, float32 sums), which gives the same token but where the uniform falls within rounding of a
boundary. One graph per batch size (decode_graph's BATCH_SIZES) and way (sorted, or pick_top), captured at its
first use. A decode step's draws are queued behind the forward that computes their logits (launch on its stream,
collect after its wait: engine/runner/picks.py DrawsBehind); the host's side goes through page-locked buffers, so
that queueing them waits for nothing.
"""
from __future__ import annotations

import ctypes
import sys

import numpy as np

from engine.kernels.argmax_launch import DRAW_THREADS, PICK_PARAMS, TOP_MAX
from engine.runner.decode_graph import BATCH_SIZES, padded_rows
from engine.runner.graph_pool import GraphMemoryError, graph_memory_pool
from engine.runner.sampler import SamplingParams, descending_order

PADDING = (1.0, 0, 1.0, 0.0, 0.0)  # a padding row's parameters: a plain draw over whatever its row holds, ignored
TOP_PADDING = (1.0, 1, 1.0, 0.0, 0.0)  # the same where pick_top orders the rows (its rows' top_k within TOP_MAX)


def pinned(cp, shape: tuple[int, ...], dtype) -> np.ndarray:
    """A zeroed host array in page-locked memory (np.frombuffer keeps the allocation alive)."""
    count = int(np.prod(shape))
    memory = cp.cuda.alloc_pinned_memory(count * np.dtype(dtype).itemsize)
    out = np.frombuffer(memory, dtype, count).reshape(shape)
    out[...] = 0
    return out


def address(host: np.ndarray) -> ctypes.c_void_p:
    """A host array's address as CuPy's copies take it (a ctypes pointer: older CuPy reads its .value)."""
    return ctypes.c_void_p(host.ctypes.data)


def row_params(p: SamplingParams, u: float) -> tuple[float, int, float, float, float]:
    """A row's PICK_PARAMS, in argmax.cu's order."""
    return (p.temperature, p.top_k, p.top_p, p.min_p, u)


class BatchDraws:
    """The draws of up to `rows` rows a call (decode_graph's largest batch size, a decode step's MAX_BATCH)."""

    def __init__(self, cp, kernels, vocab: int):
        self.cp, self.kernels, self.vocab = cp, kernels, vocab
        self.rows = rows = BATCH_SIZES[-1]
        self.stream = cp.cuda.Stream(non_blocking=True)
        self.pool = graph_memory_pool(cp)  # the scratch of the graphs (engine/runner/graph_pool.py)
        # inputs and output at fixed addresses, outside the graphs' pool: (rows, vocab) fp32 staging, each row's
        # logits copied in; (rows, PICK_PARAMS) fp64; (rows,) int64 tokens
        self.logits = cp.zeros((rows, vocab), dtype=cp.float32)
        self.params = cp.zeros((rows, PICK_PARAMS), dtype=cp.float64)
        self.tokens = cp.zeros(rows, dtype=cp.int64)
        self.index = cp.zeros(rows, dtype=cp.int64)  # (rows,) the gathered rows of a matrix
        # the host's side in page-locked memory, copied without the driver's staging (an asynchronous copy from
        # pageable memory may wait for the stream's work, a decode step's forward): (rows, PICK_PARAMS) fp64 the
        # rows' parameters, (rows,) int64 the gathered rows, (rows,) int64 the tokens back
        self.host = pinned(cp, (rows, PICK_PARAMS), np.float64)
        self.host_index = pinned(cp, (rows,), np.int64)
        self.host_tokens = pinned(cp, (rows,), np.int64)
        self.graphs: dict[tuple[int, bool], object] = {}  # (batch size, by pick_top) -> its graph
        self.capturable = True

    def draw(self, rows: list[tuple[object, SamplingParams, float]], gather: tuple | None = None) -> list[int]:
        """Each row's token: (logits (vocab,) fp32 on the device, written on the current stream, its
        parameters (temperature > 0), its uniform). gather: (matrix, indices) when every row's logits are
        rows of one matrix (a decode graph's output): one gather then, not a copy a row."""
        self.stream.wait_event(self.cp.cuda.get_current_stream().record())  # the logits are written
        self.launch(rows, gather, self.stream, capture=True)
        return self.collect(len(rows), self.stream)

    def launch(self, rows: list[tuple[object, SamplingParams, float]], gather: tuple | None, stream,
               capture: bool = False) -> bool:
        """draw's work queued on `stream` after what it holds (the logits' writer), its tokens copied back there,
        nothing waited for; collect(len(rows), stream) gives them (a row's logits unread where `gather` is given).
        One launch at a time: the buffers are shared until collected. False (nothing queued) where the batch size's
        graph is not captured yet, unless `capture`: a capture runs eagerly and synchronizes, not for a stream with
        a forward in flight."""
        cp, n = self.cp, len(rows)
        size, top = self.key([p for _, p, _ in rows])
        graph = self.graphs.get((size, top))
        if graph is None and self.capturable and not capture:
            return False
        with stream:
            for i, (_, p, u) in enumerate(rows):
                self.host[i] = row_params(p, u)
            self.host[n:size] = TOP_PADDING if top else PADDING
            self.params.data.copy_from_host_async(address(self.host), size * self.host[0].nbytes, stream)
            if gather is not None:
                source, index = gather
                self.host_index[:n] = index
                self.index.data.copy_from_host_async(address(self.host_index), n * 8, stream)
                cp.take(source, self.index[:n], axis=0, out=self.logits[:n])
            else:
                for i, (logits, _, _) in enumerate(rows):
                    logits = cp.ascontiguousarray(logits, dtype=cp.float32)
                    self.logits[i].data.copy_from_device_async(logits.data, logits.nbytes, stream)
            if graph is None:
                graph = self.capture(size, top)
            if graph is not None:
                graph.launch(stream)
            else:
                self.kernels.pick_rows(self.logits[:size], self.params[:size], self.tokens[:size], top)
            self.tokens.data.copy_to_host_async(address(self.host_tokens), n * 8, stream)
        return True

    def key(self, params: list[SamplingParams]) -> tuple[int, bool]:
        """The graph that draws these rows: (its batch size, whether by pick_top)."""
        return padded_rows(len(params)), all(0 < p.top_k <= TOP_MAX for p in params)

    def ready(self, size: int, top: bool) -> bool:
        """Whether a launch of this key queues without a capture (its graph is there, or graphs are off)."""
        return (size, top) in self.graphs or not self.capturable

    def collect(self, n: int, stream) -> list[int]:
        """The tokens of the latest launch of n rows on `stream`, once it has run."""
        stream.synchronize()
        return self.host_tokens[:n].tolist()

    def capture(self, size: int, top: bool):
        """The draw of `size` rows (by pick_top where `top`) as a graph (None where it cannot be: the rows are then
        launched). An eager run first fills the pool, so that the capture allocates nothing."""
        if not self.capturable:
            return None
        cp, args = self.cp, (self.logits[:size], self.params[:size], self.tokens[:size], top)
        try:
            with cp.cuda.using_allocator(self.pool.malloc):
                self.kernels.pick_rows(*args)
                self.stream.synchronize()
                self.stream.begin_capture()
                try:
                    self.kernels.pick_rows(*args)
                finally:
                    graph = self.stream.end_capture()
        except GraphMemoryError:  # no room now: launched this time, captured later
            return None
        except Exception as e:  # something the driver or CuPy will not capture: launches from now on
            print(f"strata: batched sampling graphs unavailable ({type(e).__name__}: {e}); drawing with launches",
                  file=sys.stderr, flush=True)
            self.capturable = False
            return None
        self.graphs[size, top] = graph
        return graph


def draw_segmented(scaled: np.ndarray, u: float, p: SamplingParams) -> int:
    """argmax.cu's pick_draw for one row in NumPy, operation for operation: scaled (n,) fp32 (logits over
    the temperature), u the uniform. The candidates in descending order (the first top_k, or all) weigh
    e_i = exp(s_i - s_0) (fp64 exp rounded to fp32); DRAW_THREADS slices of consecutive candidates are
    summed in order (fp64), the slices' sums scanned Hillis-Steele, cum_i = its slice's offset plus the
    slice's running sum; then min-p, top-p and the inverse CDF at u times the kept mass."""
    order = descending_order(scaled)
    n = len(scaled)
    m = p.top_k if 0 < p.top_k < n else n
    e = np.exp((scaled[order[:m]] - scaled[order[0]]).astype(np.float64)).astype(np.float32)  # (m,)
    width = -(-m // DRAW_THREADS)
    slices = np.zeros(DRAW_THREADS * width, dtype=np.float64)
    slices[:m] = e
    slices = slices.reshape(DRAW_THREADS, width)  # (threads, width): thread t's candidates, zeros past m
    part = np.cumsum(slices, axis=1)[:, -1]  # (threads,) each slice summed in order
    off = 1
    while off < DRAW_THREADS:  # Hillis-Steele: part[t] += part[t - off], all t at once
        part = np.concatenate([part[:off], part[off:] + part[:-off]])
        off *= 2
    offset = np.concatenate([[0.0], part[:-1]])  # (threads,)
    cum = np.cumsum(np.hstack([offset[:, None], slices]), axis=1)[:, 1:].reshape(-1)[:m]  # (m,) in order
    total = part[-1]
    keep = max(1, int(np.count_nonzero(e >= np.float32(p.min_p)))) if p.min_p > 0 else m
    if p.top_p < 1.0:
        reach = np.flatnonzero(cum >= p.top_p * total)
        keep = min(keep, (int(reach[0]) if len(reach) else m) + 1)
    keep = min(keep, m)
    kept = total if keep == m else cum[keep - 1]
    past = np.flatnonzero(cum > u * kept)
    return int(order[min(int(past[0]) if len(past) else m, keep - 1)])
