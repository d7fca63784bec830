"""The NumPy/CuPy switch. The only module that imports cupy; the rest is array code over `xp`.

The forward pass (engine/model/forward.py) is written once against the operations below. ArrayOps is
plain float32 array code: the CPU path and the reference every GPU kernel is checked against.
HalfCupyOps runs the same operations in half precision on the GPU through the kernels in
engine/kernels/ (fp16 activations and KV cache; fp32 residual stream, norm statistics, softmax
and logits)."""
from __future__ import annotations

import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from types import ModuleType

import numpy as np

from engine.core.kv_types import widened
from engine.core.deferred import GatedSum, Projection
from engine.ops.expert_cache import ExpertCache
from engine.ops.hybrid_ops import HybridArrayOps, HybridHalfOps
from engine.ops.moe import route, run_experts
from engine.ops.upload import PinnedUpload
from engine.core.quantized import QuantMatrix, Row8
from engine.core.step import Step
from engine.kernels.model_parts import ModelKernels

KEY_TILE = 256  # keys per attention tile on the CPU, at absolute multiples, the last one padded: a row's sums
# never depend on where its chunk starts or ends (scores never exceed (kv_heads, group*n, KEY_TILE))


class ArrayOps(HybridArrayOps):
    """Weights are stored as GGUF has them, (out_features, in_features).

    Every row is computed as it would be in any other step (engine/ops/blas_order.py says when the
    BLAS allows it): a decode step's rows by one matrix-vector product each (its order depends on k
    alone), a prompt step's rows by one matrix product of at least two rows (a lone row padded), and
    attention over key tiles at absolute positions."""

    def __init__(self, xp: ModuleType):
        self.xp = xp
        self.decoding = False  # the step's rows are decode rows (one token of each sequence)

    def ready(self) -> None:
        """Waits for whatever the ops build in the background at start (the GPU's kernels); none here."""

    def step(self, n: int, start: int, table=None) -> Step:
        return Step(n, start, (table,))

    def reads_step(self, spans: tuple[tuple[int, int], ...], tables) -> Step:
        """Prompt rows of several sequences in one step: sequence i's spans[i] = (start, n) positions,
        its rows through tables[i]; its rows follow the previous sequence's."""
        return Step(sum(n for _, n in spans), spans[0][0], tuple(tables), spans=tuple(spans))

    def batch_step(self, tables, positions: tuple[int, ...]) -> Step:
        """A decode batch: row i is a sequence's next token at positions[i], its rows in the blocks
        of tables[i]."""
        return Step(len(tables), -1, tuple(tables), tuple(positions))

    def begin(self, step: Step) -> None:
        """A forward over `step` starts (decode rows and prompt rows take different products)."""
        self.decoding = step.decode

    def embed(self, table, tokens):
        """table: (vocab, dim), tokens: (n,) -> the fp32 residual stream (n, dim)."""
        return table[self.xp.asarray(tokens)].astype(self.xp.float32)

    def matmul(self, x, w):
        """x: (n, k), w: (m, k) -> (n, m). Decode rows one matrix-vector product each; prompt rows one
        product of at least two rows (BLAS sends a single row to its matrix-vector kernel)."""
        if self.decoding:
            if len(x) == 1:
                return x @ w.T
            return self.xp.concatenate([x[i : i + 1] @ w.T for i in range(len(x))])
        return rows_product(self.xp, x, w.T)

    def product(self, delta):
        """delta as an array: a Projection's rows times its weight, a GatedSum's sum, anything else as it is."""
        if isinstance(delta, Projection):
            return self.matmul(delta.rows, delta.weight)
        if isinstance(delta, GatedSum):
            return self.add_gated(delta.routed, delta.shared, delta.h, delta.gate_w)
        return delta

    def add_rms_norm(self, x, delta, weight, eps: float):
        """x += delta (when given: an array, a Projection or a GatedSum; the residual add), then rms_norm(x) *
        weight."""
        delta = self.product(delta)
        if delta is not None:
            x += delta
        return x * (1.0 / self.xp.sqrt(self.xp.mean(x * x, axis=-1, keepdims=True) + eps)) * weight

    def head_rms_norm(self, qkv, q_weight, k_weight, heads: int, kv_heads: int, eps: float):
        """qkv: (n, (heads + 2*kv_heads) * d) -> the same with each Q and K head RMS-normalized over
        its d values and scaled by q_weight / k_weight (d,) (Qwen3). Computed in float32."""
        n, width = qkv.shape
        x = qkv.reshape(n, -1, width // (heads + 2 * kv_heads)).astype(np.float32)  # a copy
        for lo, hi, w in ((0, heads, q_weight), (heads, heads + kv_heads, k_weight)):
            part = x[:, lo:hi]
            x[:, lo:hi] = part / self.xp.sqrt(self.xp.mean(part * part, axis=-1, keepdims=True) + eps) * w
        return x.reshape(n, width).astype(qkv.dtype)

    def rows(self, h):
        """An activation as a plain (n, k) array."""
        return h

    def rope(self, x, cos, sin):
        """x: (n, heads, d) with each head laid out [evens, odds]; cos/sin: (n, 1, d/2)."""
        half = x.shape[-1] // 2
        x1, x2 = x[..., :half], x[..., half:]
        return self.xp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)

    def rope_store(self, qkv, cos_table, sin_table, k_cache, v_cache, step: Step, norms=None):
        """qkv: (n, (heads + 2*kv_heads) * d); cos/sin tables: (positions, 1, d/2); k_cache/v_cache:
        a layer's pool (blocks, kv_heads, block_size, d): the rows of positions start..start+n of
        the step's sequence written through its block table (K rotated); for a decode batch, row i
        at positions[i] through tables[i]. norms: (q_weight, k_weight, eps) when each Q and K head
        is RMS-normalized first (Qwen3). Returns q rotated: (n, heads, d)."""
        kv_heads, d = k_cache.shape[-3], k_cache.shape[-1]
        if norms is not None:
            qkv = self.head_rms_norm(qkv, *norms[:2], qkv.shape[1] // d - 2 * kv_heads, kv_heads, norms[2])
        n = qkv.shape[0]
        at = step.row_positions()  # (n,)
        cos, sin = cos_table[at], sin_table[at]  # (n, 1, d/2)
        heads = qkv.shape[1] // d - 2 * kv_heads
        qkv = qkv.reshape(n, heads + 2 * kv_heads, d)
        self.store_rows(self.rope(qkv[:, heads : heads + kv_heads], cos, sin), qkv[:, heads + kv_heads :],
                        k_cache, v_cache, step)
        return self.rope(qkv[:, :heads], cos, sin)

    @staticmethod
    def store_rows(k_new, v_new, k_cache, v_cache, step: Step) -> None:
        """k_new, v_new: (n, kv_heads, d), the step's rows -> a layer's pool (blocks, kv_heads, block_size,
        d), each at its position through its sequence's block table."""
        size = k_cache.shape[-2]
        at = step.row_positions()  # (n,)
        if step.batch:  # each row's block through its own table
            block = np.asarray([t[p // size] for t, p in zip(step.tables, at)], dtype=np.int64)  # (n,)
        else:  # one table a sequence: one vectorized lookup each, not a Python loop per token
            block = np.concatenate([np.asarray(table, dtype=np.int64)[at[lo:hi] // size]
                                    for table, (lo, hi) in zip(step.tables, step.row_ranges())])  # (n,)
        k_cache[block, :, at % size] = k_new  # (n, kv_heads, d) rows at (block_i, :, offset_i)
        v_cache[block, :, at % size] = v_new

    @staticmethod
    def sequence_rows(cache, table, end: int):
        """One sequence's rows [0, end) of a layer's pool, in position order: (kv_heads, end, d)."""
        nb = -(-end // cache.shape[2])
        blocks = widened(cache[np.asarray(table[:nb], dtype=np.int64)])  # (nb, kv_heads, B, d), a copy
        return blocks.transpose(1, 0, 2, 3).reshape(cache.shape[1], -1, cache.shape[3])[:, :end]

    def attention(self, q, k_cache, v_cache, step: Step):
        """q: (n, heads, d), each sequence's rows at its positions; k_cache/v_cache: a layer's pool,
        each sequence's rows 0..its last position filled (through its block table). Causal, GQA.
        Returns (n, heads*d). A decode batch: each row against its own rows 0..positions[i]."""
        if step.batch:
            return self.xp.concatenate([self.sequence_attention(q[i : i + 1], k_cache, v_cache, p, t)
                                        for i, (t, p) in enumerate(zip(step.tables, step.positions))])
        return self.xp.concatenate([self.sequence_attention(q[lo:hi], k_cache, v_cache, start, table)
                                    for table, (start, _), (lo, hi) in zip(step.tables, step.spans_or_one(),
                                                                           step.row_ranges())])

    def sequence_attention(self, q, k_cache, v_cache, start: int, table):
        """One sequence's n query rows at positions start..start+n against its keys 0..start+n:
        online softmax over tiles of KEY_TILE keys cut at absolute multiples of KEY_TILE, the last
        one padded (score -inf, value 0), so that every product and sum has the same length
        whichever chunk the row is in; a tile past a row's position adds exact zeros to it."""
        xp = self.xp
        n, heads, d = q.shape
        kv_heads = k_cache.shape[1]
        group, end = heads // kv_heads, start + n
        keys = self.sequence_rows(k_cache, table, end)  # (kv_heads, end, d)
        values = self.sequence_rows(v_cache, table, end)
        # heads h = kv*group + g share kv head `kv`: (kv_heads, group*n, d), rows ordered (g, i)
        qg = q.reshape(n, kv_heads, group, d).transpose(1, 2, 0, 3)
        qg = (qg * np.float32(1.0 / np.sqrt(d))).reshape(kv_heads, group * n, d)
        rows = group * n
        if rows == 1:  # a product of one row is BLAS's matrix-vector kernel: two rows, the second ignored
            qg = xp.concatenate([qg, qg], axis=1)
        at = xp.asarray(np.tile(np.arange(start, end), group))[:, None]  # (rows, 1) each row's position
        best = acc = norm = None
        for t0 in range(0, end, KEY_TILE):
            k_tile, v_tile = padded_tile(xp, keys, t0), padded_tile(xp, values, t0)  # (kv_heads, KEY_TILE, d)
            s = qg @ k_tile.transpose(0, 2, 1)  # (kv_heads, rows, KEY_TILE)
            if t0 + KEY_TILE - 1 > start:  # keys after some row's position (the diagonal, or the padding)
                s[:, :rows][:, (xp.arange(t0, t0 + KEY_TILE)[None, :] > at)] = -np.inf
            tile_max = s.max(axis=-1, keepdims=True)
            new_best = tile_max if best is None else xp.maximum(best, tile_max)
            xp.subtract(s, new_best, out=s)
            p = xp.exp(s, out=s)  # unnormalized probabilities, in place
            if best is None:
                acc, norm = p @ v_tile, p.sum(axis=-1, keepdims=True)
            else:
                corr = xp.exp(best - new_best)
                acc = acc * corr + p @ v_tile
                norm = norm * corr + p.sum(axis=-1, keepdims=True)
            best = new_best
        out = (acc[:, :rows] / norm[:, :rows]).reshape(kv_heads, group, n, d)  # (kv, g, n, d)
        return out.transpose(2, 0, 1, 3).reshape(n, heads * d)

    def gate_up_act(self, h, w_gate_up):
        """h (n, dim) against a stacked gate_up (2 ffn, dim) -> silu(gate) * up (n, ffn): the feed-forward's
        activation."""
        return self.silu_mul(self.matmul(h, w_gate_up))

    def silu_mul(self, gate_up):
        """gate_up: (n, 2*ffn) = [gate | up] -> silu(gate) * up: (n, ffn)."""
        ffn = gate_up.shape[1] // 2
        gate, up = gate_up[:, :ffn], gate_up[:, ffn:]
        return gate / (1.0 + self.xp.exp(-gate)) * up

    def logits(self, h, head):
        """h: (n, dim), head: (vocab, dim) -> (n, vocab) float32."""
        return self.matmul(h, head)

    def mixture(self, h, router, experts, k: int, normalize: bool):
        """A MoE feed-forward (engine/ops/moe.py): h (n, dim), router (experts, dim) float32 -> (out (n, dim),
        chosen experts (n, k), their weights (n, k) float32)."""
        chosen, weights = route(self.matmul(h, router), k, normalize)
        if not isinstance(experts, ExpertCache):
            return run_experts(self, h, experts, chosen, weights), chosen, weights
        out = np.empty(h.shape, dtype=h.dtype)  # routed experts behind a cache's slots: counted, the same bits
        for rows, slots in experts.placed(chosen):
            out[rows] = run_experts(self, h[rows], experts.device, chosen[rows], weights[rows], slots)
        return out, chosen, weights


class HalfCupyOps(HybridHalfOps, ArrayOps):
    """The same operations on the GPU in half precision, each one kernel (engine/kernels/):
    cuBLAS GEMMs on the fp16 weights as stored, fused norm/RoPE/SwiGLU, flash attention. A weight
    may be a QuantMatrix (engine/core/quantized.py): single rows read its blocks directly, a prompt
    chunk's GEMM reads it expanded to fp16 in a scratch buffer."""

    def __init__(self, cp: ModuleType, model: ModelKernels | None = None):
        """model: the kernels built first are those it needs (engine/kernels/model_parts.py); all without."""
        super().__init__(cp)
        from engine.kernels import GpuKernels

        self.kernels = GpuKernels(cp, model=model)
        self.decoding = False

    def ready(self) -> None:
        self.kernels.ready()  # the kernels, compiled beside the weights' upload on a first start

    def step(self, n: int, start: int, table=None) -> Step:
        return self.kernels.step(n, start, table)

    def reads_step(self, spans, tables) -> Step:
        return self.kernels.reads_step(spans, tables)

    def batch_step(self, tables, positions: tuple[int, ...]) -> Step:
        return self.kernels.batch_step(tables, positions)

    def begin(self, step: Step) -> None:
        self.decoding = step.decode  # rows one token each: matvecs, flash-decoding, 8-bit rows

    def embed(self, table, tokens):
        if isinstance(table, QuantMatrix):
            return self.kernels.embed(table, tokens)
        return super().embed(table, tokens)

    def matmul(self, x, w):
        """A decode step's rows by the matvec kernel (memory-bound, batch-invariant, capturable in a
        graph); they come as a Row8 (its producer also wrote them in 8 bits, for quantized weights).
        A prompt chunk by cuBLAS, a quantized weight expanded to fp16 in a scratch buffer first."""
        if isinstance(x, Row8):
            return self.kernels.matvec(w, x.values, self.xp.float16, x.q8, x.q8k)
        if self.decoding:
            return self.kernels.matvec(w, x, self.xp.float16)
        if isinstance(w, QuantMatrix):
            w = self.kernels.expand(w)
        return x @ w.T

    def add_rms_norm(self, x, delta, weight, eps: float):
        """A lone decode row's projection and this norm in one kernel (matvec_norm) where its weight allows; a
        gated sum and this norm in one kernel always (add_gated_rms_norm)."""
        if isinstance(delta, Projection) and isinstance(delta.rows, Row8):
            fused = self.kernels.matvec_norm(delta.weight, delta.rows, x, weight, eps)
            if fused is not None:
                return fused
        if isinstance(delta, GatedSum):
            return self.kernels.add_gated_rms_norm(x, delta, weight, eps, q8=self.decoding)
        return self.kernels.add_rms_norm(x, self.product(delta), weight, eps, q8=self.decoding)

    def gate_up_act(self, h, w_gate_up):
        """A lone decode row's gate, up and SwiGLU in one kernel (matvec_act) where the weight allows."""
        if isinstance(h, Row8):
            fused = self.kernels.matvec_act(w_gate_up, h)
            if fused is not None:
                return fused
        return super().gate_up_act(h, w_gate_up)

    def rows(self, h):
        return h.values if isinstance(h, Row8) else h

    def rope_store(self, qkv, cos_table, sin_table, k_cache, v_cache, step: Step, norms=None):
        return self.kernels.rope_store(qkv, cos_table, sin_table, k_cache, v_cache, step, norms)

    def attention(self, q, k_cache, v_cache, step: Step):
        return self.kernels.attention(q, k_cache, v_cache, step, q8=self.decoding)

    def silu_mul(self, gate_up):
        return self.kernels.silu_mul(gate_up, q8=self.decoding)

    def mixture(self, h, router, experts, k: int, normalize: bool):
        """Routed on the device (no host round trip, so a decode step stays capturable): a decode
        step's rows each read only their chosen experts' blocks, all rows in one launch per kernel,
        each row computed as it would be alone; a prompt chunk's rows are grouped by expert
        (engine/kernels/moe.cu)."""
        moe = self.kernels.moe
        if isinstance(experts, ExpertCache):  # routed experts in host memory behind device slots
            return experts.mixture(moe, h, self.rows(h), router, k, normalize, decode=isinstance(h, Row8))
        if not isinstance(h, Row8):
            chosen, weights = moe.route(h, router, k, normalize)
            return moe.prompt(h, experts, chosen, weights), chosen, weights
        chosen, weights = moe.route(h.values, router, k, normalize, decode=True)
        return moe.decode(h, experts, chosen, weights), chosen, weights

    def logits(self, h, head):
        """h: (n, dim) rows of the final norm -> (n, vocab) float32. The head reads fp16 rows: rows handed back
        as float32 (final_logits' hidden_rows, which prompt log-probabilities score) are fp16 values, cast exactly."""
        if isinstance(h, Row8):
            return self.kernels.matvec(head, h.values, q8=h.q8, q8k=h.q8k)
        return self.kernels.matvec(head, h.astype(self.xp.float16, copy=False))


def rows_product(xp, x, wt):
    """x (n, k) @ wt (k, m) as a matrix product of at least two rows: a lone row goes with a copy
    of itself, since BLAS gives one row to its matrix-vector kernel, which orders its sums otherwise."""
    if len(x) != 1:
        return x @ wt
    return (xp.concatenate([x, x]) @ wt)[:1]


def padded_tile(xp, rows, t0: int):
    """rows (heads, end, d) -> rows t0..t0+KEY_TILE (heads, KEY_TILE, d), zeros past `end`."""
    tile = rows[:, t0 : t0 + KEY_TILE]
    if tile.shape[1] == KEY_TILE:
        return tile
    out = xp.zeros((rows.shape[0], KEY_TILE, rows.shape[2]), dtype=rows.dtype)
    out[:, : tile.shape[1]] = tile
    return out


@dataclass(frozen=True)
class Backend:
    name: str  # "cpu" | "gpu"
    xp: ModuleType  # numpy or cupy
    weight_dtype: type  # weights, activations and KV: float32 on the CPU, float16 on the GPU
    device_name: str
    ops: ArrayOps
    uploader: PinnedUpload | None = None  # the GPU's weights upload (engine/ops/upload.py)

    def asarray(self, host: np.ndarray, dtype=None):
        return self.xp.asarray(host, dtype=dtype or host.dtype)

    def upload_rows(self, pieces: list[np.ndarray]):
        """Host arrays of one dtype and trailing shape -> their rows stacked, one array on the backend
        (on a GPU through pinned buffers; `finish_uploads` when the weights are all sent)."""
        if self.uploader is not None:
            return self.uploader(pieces)
        return self.xp.asarray(pieces[0] if len(pieces) == 1 else np.concatenate(pieces))

    def finish_uploads(self) -> None:
        """Every upload landed; the staging buffers freed."""
        if self.uploader is not None:
            self.uploader.close()

    def to_host(self, arr) -> np.ndarray:
        return arr if self.xp is np else self.xp.asnumpy(arr)

    def pinned(self, host: np.ndarray) -> np.ndarray:
        """A copy of `host` in page-locked memory, whence the GPU copies at the link's rate without the driver's
        staging (on the CPU: `host` itself). Copied by a few threads, in pieces (NumPy releases the GIL)."""
        if self.xp is np:
            return host
        memory = self.xp.cuda.alloc_pinned_memory(host.nbytes)
        out = np.frombuffer(memory, host.dtype, host.size).reshape(host.shape)  # (keeps `memory` alive: its base)
        step = max(1, (256 << 20) // max(1, host[:1].nbytes))  # rows a piece: about 256 MB

        def piece(lo: int) -> None:
            out[lo : lo + step] = host[lo : lo + step]

        with ThreadPoolExecutor(4) as threads:
            list(threads.map(piece, range(0, len(host), step)))
        return out

    def ready(self) -> None:
        """Every kernel built and loaded (on a GPU's first start they compile while the weights load)."""
        self.ops.ready()

    def synchronize(self) -> None:
        if self.xp is not np:
            self.xp.cuda.Stream.null.synchronize()

    def free_bytes(self) -> int | None:
        """Device memory still free for the KV cache (None on the CPU: not managed here)."""
        if self.xp is np:
            return None
        self.xp.get_default_memory_pool().free_all_blocks()
        return int(self.xp.cuda.runtime.memGetInfo()[0])

    @property
    def kernels(self):
        return getattr(self.ops, "kernels", None)


def cpu_backend() -> Backend:
    return Backend("cpu", np, np.float32, "cpu (numpy)", ArrayOps(np))


def gpu_backend(model: ModelKernels | None = None) -> Backend:
    import cupy as cp  # optional extra: pip install .[gpu]

    cp.cuda.runtime.getDeviceCount()  # raises without a driver or a device
    props = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)
    name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    return Backend("gpu", cp, cp.float16, name, HalfCupyOps(cp, model), PinnedUpload(cp))


def select_backend(device: str, model: ModelKernels | None = None) -> Backend:
    """device: auto | cpu | gpu. `auto` falls back to NumPy with one line on stderr. model: on a GPU, the
    kernels built first are those this model needs (every kernel without it)."""
    if device == "cpu":
        return cpu_backend()
    try:
        return gpu_backend(model)
    except Exception as e:  # ImportError, CUDARuntimeError, ...
        if device == "gpu":
            raise RuntimeError(f"--device gpu requested but CuPy/CUDA is unavailable: {e}") from e
        print(f"strata: no usable GPU ({type(e).__name__}: {e}); using NumPy on the CPU",
              file=sys.stderr, flush=True)
        return cpu_backend()
