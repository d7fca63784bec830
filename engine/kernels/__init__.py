"""Thin launchers for the CUDA kernels in this folder (one .cu file per family), compiled at first
use by CuPy (NVRTC). CuPy is handed in by engine/backend.py, the only module that imports it.
Every kernel has a NumPy reference (engine/backend.py ArrayOps, gguf.quants.dequantize) that
tools/gpu_kernels_check.py compares it with on the GPU."""
from __future__ import annotations

import math
from pathlib import Path
from types import ModuleType

import numpy as np

from engine.backend import Step

KERNEL_DIR = Path(__file__).resolve().parent
OPTIONS = ("-std=c++17", "--use_fast_math")
THREADS = 256
ATTENTION_ROWS = 64  # query rows (token x grouped head) per attention block: BR in attention.cu
DECODE_KEYS = 256  # keys per flash-decoding block: DEC_WARPS * DEC_KEYS_PER_WARP in attention.cu
DECODE_KEYS_PER_WARP = 64  # one partial softmax state per warp
MAX_GROUP = 8  # query heads per K/V head the decoding kernel holds
COMBINE_GROUPS = 8  # thread rows of the partials' merge: COMBINE_GROUPS in attention.cu
HEAD_DIMS = (64, 128)  # head widths the attention kernel is built for

# GGUF type -> (kernel, values per thread): one thread expands 32 values (1 for BF16)
DEQUANT = {"Q4_0": ("dequant_q4_0", 32), "Q4_1": ("dequant_q4_1", 32), "Q5_0": ("dequant_q5_0", 32),
           "Q5_1": ("dequant_q5_1", 32), "Q8_0": ("dequant_q8_0", 32), "Q4_K": ("dequant_q4_k", 32),
           "Q5_K": ("dequant_q5_k", 32), "Q6_K": ("dequant_q6_k", 32), "BF16": ("dequant_bf16", 1)}


def attention_smem_bytes(d: int) -> int:
    """Two stages of a 64-key K tile and V tile, rows padded by 8 halves: Tiles<D>::BYTES."""
    return 2 * 2 * 64 * (d + 8) * 2


def blocks(n: int, per_block: int = THREADS) -> tuple[int]:
    return (max(1, math.ceil(n / per_block)),)


class GpuKernels:
    def __init__(self, cp: ModuleType):
        self.cp = cp
        names = {"norm_rope.cu": ("add_rms_norm", "rope_store", "silu_mul"),
                 "matvec.cu": ("matvec_f16", "matvec_f16_h"),
                 "dequant.cu": tuple(kernel for kernel, _ in DEQUANT.values()),
                 "attention.cu": (*(f"flash_attention_d{d}" for d in HEAD_DIMS),
                                  *(f"flash_decode_d{d}" for d in HEAD_DIMS), "flash_decode_combine")}
        self.fn = {}  # kernel name -> RawKernel, looked up once (not per launch)
        for source, kernels in names.items():
            module = cp.RawModule(code=(KERNEL_DIR / source).read_text(), options=OPTIONS)
            self.fn |= {name: module.get_function(name) for name in kernels}
        for d in HEAD_DIMS:  # more than the default 48 KiB of dynamic shared memory
            self.fn[f"flash_attention_d{d}"].max_dynamic_shared_size_bytes = attention_smem_bytes(d)
        self._step: Step | None = None

    # ------------------------------------------------------------ norm, RoPE, SwiGLU

    def add_rms_norm(self, x, delta, weight, eps: float):
        """x: (n, dim) fp32, updated in place by += delta (n, dim) fp16 if given; returns
        rms_norm(x) * weight as (n, dim) fp16."""
        n, dim = x.shape
        out = self.cp.empty((n, dim), dtype=self.cp.float16)
        has_delta = delta is not None
        self.fn["add_rms_norm"](
            (n,), (THREADS,), (x, delta if has_delta else out, np.int32(has_delta), weight, out,
                               np.int32(dim), np.float32(eps)))
        return out

    def rope_store(self, qkv, cos_table, sin_table, k_cache, v_cache, step: Step):
        """qkv: (n, (heads + 2*kv_heads) * d) fp16; cos/sin tables: (positions, 1, d/2) fp32;
        k_cache/v_cache: (kv_heads, ctx, d) fp16, rows start..start+n written, start read from
        the step's device copy. Returns q (n, heads, d)."""
        kv_heads, ctx, d = k_cache.shape
        n = qkv.shape[0]
        heads = qkv.shape[1] // d - 2 * kv_heads
        q = self.cp.empty((n, heads, d), dtype=self.cp.float16)
        total = n * (heads + 2 * kv_heads) * (d // 2)
        self.fn["rope_store"](
            blocks(total), (THREADS,), (qkv, q, k_cache, v_cache, cos_table, sin_table, step.pos0, np.int32(n),
                                        np.int32(heads), np.int32(kv_heads), np.int32(d), np.int32(ctx)))
        return q

    def silu_mul(self, gate_up):
        """gate_up: (n, 2*ffn) fp16 -> silu(gate) * up: (n, ffn) fp16."""
        n, two_ffn = gate_up.shape
        out = self.cp.empty((n, two_ffn // 2), dtype=self.cp.float16)
        pairs = n * two_ffn // 4
        self.fn["silu_mul"](blocks(pairs), (THREADS,), (gate_up, out, np.int32(two_ffn // 4), np.uint64(pairs)))
        return out

    # ------------------------------------------------------------ attention

    def attention(self, q, k_cache, v_cache, step: Step):
        """q: (n, heads, d) fp16 at positions start..start+n; k_cache/v_cache: (kv_heads, ctx, d)
        fp16 holding rows 0..start+n. Causal flash attention; returns (n, heads*d) fp16. One
        token goes to flash-decoding (the keys split across blocks)."""
        cp = self.cp
        n, heads, d = q.shape
        kv_heads, ctx, _ = k_cache.shape
        if d not in HEAD_DIMS:
            raise ValueError(f"head width {d} is not supported on the GPU (supported: {HEAD_DIMS})")
        if n == 1:
            return self.decode_attention(q, k_cache, v_cache, step)
        out = cp.empty((n, heads, d), dtype=cp.float16)
        rows = n * (heads // kv_heads)
        grid = (math.ceil(rows / ATTENTION_ROWS), kv_heads, 1)
        self.fn[f"flash_attention_d{d}"](
            grid, (128,), (q, k_cache, v_cache, out, step.q_start, step.pos0, step.kv_off, np.int32(heads),
                           np.int32(kv_heads), np.int32(ctx), np.float32(math.log2(math.e) / math.sqrt(d))),
            shared_mem=attention_smem_bytes(d))
        return out.reshape(n, heads * d)

    def decode_attention(self, q, k_cache, v_cache, step: Step):
        """One query token: blocks of DECODE_KEYS keys each, then the partials merged. The grid
        covers step.max_keys (a graph's bucket) or the keys present."""
        cp = self.cp
        _, heads, d = q.shape
        kv_heads, ctx, _ = k_cache.shape
        if heads // kv_heads > MAX_GROUP:
            raise ValueError(f"{heads // kv_heads} query heads per K/V head (at most {MAX_GROUP} supported)")
        splits = math.ceil((step.max_keys or step.start + 1) / DECODE_KEYS)
        partials = splits * DECODE_KEYS // DECODE_KEYS_PER_WARP
        part_o = cp.empty((heads, partials, d), dtype=cp.float32)
        part_ml = cp.empty((heads, partials, 2), dtype=cp.float32)
        out = cp.empty((1, heads, d), dtype=cp.float16)
        self.fn[f"flash_decode_d{d}"](
            (splits, kv_heads, 1), (128,), (q, k_cache, v_cache, part_o, part_ml, step.pos0, step.kv_off,
                                            np.int32(heads), np.int32(kv_heads), np.int32(ctx),
                                            np.float32(math.log2(math.e) / math.sqrt(d))))
        self.fn["flash_decode_combine"](
            (heads, 1), (d, COMBINE_GROUPS), (part_o, part_ml, out, step.pos0, np.int32(heads), np.int32(partials),
                                              np.int32(d)))
        return out.reshape(1, heads * d)

    def step(self, n: int, start: int) -> Step:
        """The kernels' description of one sequence's n tokens at `start`; every layer of a
        forward reuses it (one small copy to the device per forward)."""
        if self._step is None or (self._step.n, self._step.start) != (n, start):
            self._step = self.device_step(n, start)
        return self._step

    def static_step(self, n: int, max_keys: int) -> Step:
        """A step whose position is set in place (Step.set_position) before each graph replay."""
        return self.device_step(n, 0, max_keys)

    def device_step(self, n: int, start: int, max_keys: int | None = None) -> Step:
        cp = self.cp
        return Step(n, start, q_start=cp.asarray(np.array([0, n], dtype=np.int32)),
                    pos0=cp.asarray(np.array([start], dtype=np.int32)), kv_off=cp.zeros(1, dtype=cp.int64),
                    max_keys=max_keys)

    # ------------------------------------------------------------ single rows

    def matvec(self, w, x, dtype=np.float32):
        """w: (m, k) fp16, x: (k,) fp16 -> (m,) in dtype (float32 or float16), fp32 accumulation."""
        m, k = w.shape
        y = self.cp.empty(m, dtype=dtype)
        kernel = "matvec_f16" if np.dtype(dtype) == np.float32 else "matvec_f16_h"
        self.fn[kernel](blocks(m, 8), (256,), (w, self.cp.ascontiguousarray(x), y, np.int32(m), np.int32(k)))
        return y

    # ------------------------------------------------------------ load-time dequantization

    def dequantize(self, raw, type_name: str, shape: tuple[int, int]):
        """raw: the tensor's GGUF bytes (a host array, e.g. the memory-mapped file) -> (rows, cols)
        fp16 on the device. Only the raw bytes cross the bus."""
        kernel, per_thread = DEQUANT[type_name]
        src = self.cp.asarray(np.ascontiguousarray(raw))
        out = self.cp.empty(shape, dtype=self.cp.float16)
        n = shape[0] * shape[1] // per_thread
        self.fn[kernel](blocks(n), (THREADS,), (src, out, np.int64(n)))
        return out
