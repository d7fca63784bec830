"""Launchers of norm_rope.cu: norm, RoPE, SwiGLU, a row at a time (batch-invariant)."""
from __future__ import annotations

from types import ModuleType

import numpy as np

from engine.core.deferred import GatedSum
from engine.core.quantized import UNIT, Row8
from engine.core.step import Step
from engine.kernels.args import log2, or_null, pool_args, q8_units, q8k_blocks
from engine.kernels.limits import THREADS, blocks

NORM_MAX_WIDTH = 8 * 256 * 6  # add_rms_norm: eight values a thread, six times, 256 threads (NORM_OCTETS)


def check_norm_width(dim: int) -> None:
    if dim % UNIT:
        raise ValueError(f"a row width of {dim} is not a multiple of {UNIT} (the kernels read 32 values at a time)")
    if dim > NORM_MAX_WIDTH:
        raise ValueError(f"a row width of {dim} is wider than the norm kernel's {NORM_MAX_WIDTH}")


class NormRopeLaunchers:
    """Mixed into GpuKernels, which sets what these read: cp (CuPy), fn (kernel name -> function)."""

    cp: ModuleType
    fn: dict
    sbq = False  # the rows' Q8K super-blocks written too, for sbq.cu's matvecs (GpuKernels sets it: $STRATA_SBQ=1)

    def eight_bit_room(self, n: int, width: int, q8: bool, matvec: bool = True) -> tuple:
        """Room for the 8-bit forms a kernel writes beside its n fp16 rows of `width` with q8: their Q8 units, and
        their Q8K super-blocks where the rows go to a matvec and sbq.cu takes them (else None: NULL)."""
        return q8_units(self.cp, n * width, q8), q8k_blocks(self.cp, n, width, q8 and matvec and self.sbq)

    def add_rms_norm(self, x, delta, weight, eps: float, q8: bool = False):
        """x: (n, dim) fp32, updated in place by += delta (n, dim) fp16 if given; returns
        rms_norm(x) * weight as (n, dim) fp16, or for q8 a Row8 with its 8-bit forms."""
        n, dim = x.shape
        check_norm_width(dim)
        out = self.cp.empty((n, dim), dtype=self.cp.float16)
        units, sb = self.eight_bit_room(n, dim, q8)
        has_delta = delta is not None
        self.fn["add_rms_norm"](
            (n,), (THREADS,), (x, delta if has_delta else out, np.int32(has_delta), weight, out,
                               or_null(units), or_null(sb), np.int32(dim), np.float32(eps)))
        return Row8(out, units, sb) if q8 else out

    def add_gated_rms_norm(self, x, gated: GatedSum, weight, eps: float, q8: bool = False):
        """x: (n, dim) fp32 += gated's sum (routed + shared * sigmoid(h . gate_w), rows (n, dim) fp16), then
        rms_norm(x) * weight as add_rms_norm returns it: gate, sum and norm in one kernel, a block a row."""
        n, dim = x.shape
        check_norm_width(dim)
        out = self.cp.empty((n, dim), dtype=self.cp.float16)
        units, sb = self.eight_bit_room(n, dim, q8)
        self.fn["add_gated_rms_norm"](
            (n,), (THREADS,), (x, gated.routed, gated.shared, gated.h, gated.gate_w, weight, out, or_null(units),
                               or_null(sb), np.int32(dim), np.float32(eps)))
        return Row8(out, units, sb) if q8 else out

    def rope_store(self, qkv, cos_table, sin_table, k_cache, v_cache, step: Step, norms=None):
        """qkv: (n, (heads + 2*kv_heads) * d) fp16; cos/sin tables: (positions, 1, d/2) fp32;
        k_cache/v_cache: a layer's pool (blocks, kv_heads, block, d), fp16 or a Q8Array (q8_0, quantized
        as written), the rows of positions start..start+n written through the step's block table
        (start read from the step's device copy); for a decode batch, row i at its own position
        through its own table. norms:
        (q_weight, k_weight, eps) to RMS-normalize each Q and K head first (Qwen3), in the same
        kernel. Returns q (n, heads, d)."""
        _, kv_heads, block, d = k_cache.shape
        n = qkv.shape[0]
        heads = qkv.shape[1] // d - 2 * kv_heads
        q = self.cp.empty((n, heads, d), dtype=self.cp.float16)
        if step.row_pos0 is not None:  # several sequences' prompt rows: each row as a decode batch's
            pos0, table_off, seqs = step.row_pos0, step.row_table_off, n
        else:
            pos0, table_off, seqs = step.pos0, step.table_off, n if step.batch else 1
        common = (qkv, q, *pool_args(k_cache, v_cache), cos_table, sin_table, pos0, step.table, table_off,
                  np.int32(seqs))
        if norms is None:
            total = n * (heads + 2 * kv_heads) * (d // 2)
            self.fn["rope_store"](blocks(total), (THREADS,), (*common, np.int32(n), np.int32(heads),
                                                               np.int32(kv_heads), np.int32(d), log2(block)))
        else:
            q_weight, k_weight, eps = norms
            self.fn["norm_rope_store"](blocks(n * (heads + 2 * kv_heads), 4), (128,),
                                       (*common, q_weight, k_weight, np.int32(n), np.int32(heads), np.int32(kv_heads),
                                        np.int32(d), log2(block), np.float32(eps)))
        return q

    def silu_mul(self, gate_up, q8: bool = False, matvec: bool = True):
        """gate_up: (n, 2*ffn) fp16 -> silu(gate) * up: (n, ffn) fp16 (a Row8 with q8; its Q8K too where the rows go
        to a matvec, not to the experts' kernels, and sbq.cu takes them)."""
        n, two_ffn = gate_up.shape
        out = self.cp.empty((n, two_ffn // 2), dtype=self.cp.float16)
        if (two_ffn // 2) % UNIT:
            raise ValueError(f"an FFN width of {two_ffn // 2} is not a multiple of {UNIT}")
        units, sb = self.eight_bit_room(n, two_ffn // 2, q8, matvec)
        octets = out.size // 8
        self.fn["silu_mul"](blocks(octets), (THREADS,), (gate_up, out, or_null(units), or_null(sb),
                                                         np.int32(two_ffn // 2), np.int64(octets)))
        return Row8(out, units, sb) if q8 else out
