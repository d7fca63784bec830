"""Launchers of attention.cu and attention_sm90.cu: a prompt chunk's causal flash attention (wgmma
or mma.sync), a decode step's flash-decoding, a q8_0 pool's blocks widened to fp16; and the
geometry of their grids."""
from __future__ import annotations

import math
from types import ModuleType

import numpy as np

from engine.core.kv_types import Q8Array
from engine.core.quantized import Row8
from engine.core.step import Step
from engine.kernels import sm90
from engine.kernels.args import log2, or_null, pool_args, q8_units, q8k_blocks
from engine.kernels.limits import COUNTER_SEQUENCES, THREADS, blocks

ATTENTION_ROWS = 64  # query rows (token x grouped head) per attention block: BR in attention.cu
PROMPT_ATTENTION = ("sm90", "mma")  # prompt-chunk attention kernels: wgmma (attention_sm90.cu, compute
# capability 9.0 only) and mma.sync (attention.cu, any GPU); $STRATA_PROMPT_ATTENTION picks one
DECODE_THREADS = 128  # a flash-decoding block: DEC_WARPS warps in attention.cu
DECODE_SPLITS = 48  # DEC_SPLITS in attention.cu: splits a long sequence is cut into (48 x 8 K/V heads fit
# one wave of 3 blocks on each of the H200's 132 multiprocessors; 64 took 1.29 waves, the last one a tail)
DECODE_MAX_SPLITS = -(-DECODE_SPLITS // 32) * 32  # DEC_MAX_SPLITS: the merge's capacity, whole warps of splits
DECODE_BLOCKS_PER_SM = 4  # flash-decoding blocks a multiprocessor before a block takes several splits
MAX_GROUP = 8  # query heads per K/V head the decoding kernels are built for (one kernel each)
HEAD_DIMS = (64, 128, 256)  # head widths the attention kernels are built for (256: the hybrid families')
SM90_HEAD_DIMS = (64, 128)  # head widths attention_sm90.cu is built for (a 256-wide head's prompt: mma.sync)
WIDE_HEADS = 2  # query heads a flash-decoding block of a 256-wide head takes (more spill registers)


def decode_kernel_groups(d: int) -> tuple[int, ...]:
    """The query heads a flash-decoding block takes that attention.cu builds a kernel for, at head width d."""
    return tuple(range(1, (MAX_GROUP if d <= 128 else WIDE_HEADS) + 1))
MAX_COUNTER_HEADS = 256  # K/V head groups per sequence the counters hold (kv_heads x kv_div)


def attention_smem_bytes(d: int) -> int:
    """Two stages of a 64-key K tile and V tile, rows padded by 8 halves: Tiles<D>::BYTES."""
    return 2 * 2 * 64 * (d + 8) * 2


def decode_keys_per_block(keys: int) -> int:
    """Keys one flash-decoding block reads: 64 (a round of 16 for each of its 4 warps) up to
    DECODE_SPLITS x 64 keys, then the fewest multiple of 64 that cuts them in at most DECODE_SPLITS
    (attention.cu computes the same from the sequence's own length)."""
    return 64 * max(1, -(-keys // (DECODE_SPLITS * 64)))


def decode_splits(keys: int) -> int:
    """Blocks per K/V head a flash-decoding grid needs so that any sequence of up to `keys` keys
    finds all of its splits in it."""
    return min(DECODE_SPLITS, math.ceil(keys / 64))


def decode_group(group: int, d: int = 128) -> tuple[int, int]:
    """(the heads a decoding block takes, blocks per K/V head) for `group` query heads per K/V head of width d:
    more than 4 heads a block spill registers, so an even group over 4 runs as two blocks of half of it; a
    256-wide head's group as blocks of at most WIDE_HEADS. The block's heads name the kernel
    (flash_decode_d<D>_g<heads>)."""
    if d > 128:
        kv_div = next(k for k in range(1, group + 1) if group % k == 0 and group // k <= WIDE_HEADS)
    else:
        kv_div = 2 if group > 4 and group % 2 == 0 else 1
    return group // kv_div, kv_div


def decode_blocks_x(splits: int, seqs: int, blocks_y: int, sms: int) -> int:
    """Blocks per (sequence, K/V head group) of a flash-decoding grid of `splits` splits: one a split
    while the grid has up to DECODE_BLOCKS_PER_SM blocks a multiprocessor; beyond, each block takes
    several splits in turn (the same partials, merged alike: attention.cu)."""
    per_block = max(1, seqs * blocks_y * splits // (DECODE_BLOCKS_PER_SM * sms))
    return math.ceil(splits / min(per_block, splits))


class AttentionLaunchers:
    """Mixed into GpuKernels, which sets what these read: cp (CuPy), fn (kernel name -> function),
    sms (the device's multiprocessors), counters (flash-decoding's block counters), prompt_attention
    (PROMPT_ATTENTION: the prompt chunks' kernel)."""

    cp: ModuleType
    fn: dict
    sms: int
    counters: object
    sbq = False  # a decode step's outputs in Q8K too, for sbq.cu's matvecs (GpuKernels sets it: $STRATA_SBQ=1)
    prompt_attention: str

    def attention(self, q, k_cache, v_cache, step: Step, q8: bool = False):
        """q: (n, heads, d) fp16 at positions start..start+n; k_cache/v_cache: a layer's pool
        (blocks, kv_heads, block, d), fp16 or a Q8Array, the sequence's rows 0..start+n filled
        (through its block table). Causal flash attention; returns (n, heads*d) fp16. A decode step
        (one token, or a batch of sequences with one token each) goes to flash-decoding (the keys
        split across blocks; a Row8 with q8), which reads a q8_0 pool as it is; a prompt chunk's
        kernel reads its sequence's q8_0 rows widened to fp16 (widen_q8_0)."""
        cp = self.cp
        n, heads, d = q.shape
        _, kv_heads, block, _ = k_cache.shape
        if d not in HEAD_DIMS:
            raise ValueError(f"head width {d} is not supported on the GPU (supported: {HEAD_DIMS})")
        if step.decode:
            return self.decode_attention(q, k_cache, v_cache, step, q8)
        table, table_off = step.table, step.table_off
        if isinstance(k_cache, Q8Array):
            held, table, table_off = self.widened_tables(step, block)
            k_cache, v_cache = self.widen_q8_0(k_cache, held), self.widen_q8_0(v_cache, held)
        out = cp.empty((n, heads, d), dtype=cp.float16)
        spans = step.spans_or_one()
        rows = max(count for _, count in spans) * (heads // kv_heads)  # the longest sequence's rows
        if self.prompt_attention == "sm90" and d in SM90_HEAD_DIMS:
            name, per_block, threads, smem = f"flash_attention_sm90_d{d}", sm90.ROWS, sm90.THREADS, sm90.smem_bytes(d)
        else:
            name, per_block, threads, smem = f"flash_attention_d{d}", ATTENTION_ROWS, 128, attention_smem_bytes(d)
        self.fn[name]((math.ceil(rows / per_block), kv_heads, len(spans)), (threads,),
                      (q, k_cache, v_cache, out, step.q_start, step.pos0, table, table_off, np.int32(heads),
                       np.int32(kv_heads), log2(block), np.float32(math.log2(math.e) / math.sqrt(d))), shared_mem=smem)
        return out.reshape(n, heads * d)

    def widened_tables(self, step: Step, block: int) -> tuple:
        """A prompt step over a q8_0 pool: the blocks that hold its sequences' keys (each one's rows
        0..start+n), and the tables and offsets the kernel reads them by once widened (the identity,
        one sequence's after another's), on the device; made once per forward (every layer's step
        reads the same blocks)."""
        if step.held is None:
            cp = self.cp
            parts = [np.asarray(table[: -(-(start + n) // block)], dtype=np.int32)
                     for table, (start, n) in zip(step.tables, step.spans_or_one())]
            offsets = np.concatenate([[0], np.cumsum([len(p) for p in parts])[:-1]]).astype(np.int32)
            held = cp.asarray(np.concatenate(parts))
            step.held = (held, cp.arange(held.size, dtype=cp.int32), cp.asarray(offsets))
        return step.held

    def widen_q8_0(self, pool: Q8Array, held):
        """A layer's q8_0 pool -> its blocks `held` (count,) in fp16: (count, kv_heads, block, d), in
        that order (NumPy reference: Q8Array.dequantize of pool[held])."""
        _, kv_heads, block, d = pool.shape
        out = self.cp.empty((held.size, kv_heads, block, d), dtype=self.cp.float16)
        octets = out.size // 8
        self.fn["widen_q8_0_blocks"](blocks(octets), (THREADS,), (pool.q, pool.scale, out, held, np.int64(octets),
                                                                  np.int64(kv_heads * block * d)))
        return out

    def decode_attention(self, q, k_cache, v_cache, step: Step, q8: bool = False):
        """One query token per sequence (q: (sequences, heads, d)): blocks of keys, their partials
        merged by the last block to finish. Each sequence splits its keys by its own length
        (decode_keys_per_block, in the kernel), so its result does not depend on the batch beside it
        or on the graph bucket; the grid covers the most splits any length up to step.max_keys (a
        graph's bucket) or the longest sequence present can use. With q8, a Row8 (the output in 8
        bits too)."""
        cp = self.cp
        seqs, heads, d = q.shape
        _, kv_heads, block, _ = k_cache.shape
        group = heads // kv_heads
        if group > MAX_GROUP:
            raise ValueError(f"{group} query heads per K/V head (at most {MAX_GROUP} supported)")
        group, kv_div = decode_group(group, d)
        blocks_y = kv_heads * kv_div
        keys = step.max_keys or (max(step.positions) + 1 if step.batch else step.start + 1)
        splits = decode_splits(keys)
        part_o = cp.empty((seqs, heads, splits, d), dtype=cp.float32)
        part_ml = cp.empty((seqs, heads, splits, 2), dtype=cp.float32)
        out = cp.empty((seqs, heads, d), dtype=cp.float16)
        units = q8_units(cp, seqs * heads * d, q8)  # (a block's group of outputs whole Q8K super-blocks, or none)
        sb = q8k_blocks(cp, seqs, heads * d, q8 and self.sbq and group * d % 256 == 0)
        if self.counters.size < seqs * blocks_y:
            raise ValueError(f"a decode batch of {seqs} sequences exceeds the {COUNTER_SEQUENCES} the kernels hold")
        kind = "_q8" if isinstance(k_cache, Q8Array) else ""
        self.fn[f"flash_decode{kind}_d{d}_g{group}"](
            (decode_blocks_x(splits, seqs, blocks_y, self.sms), blocks_y, seqs), (DECODE_THREADS,),
            (q, *pool_args(k_cache, v_cache), part_o, part_ml, out, or_null(units), or_null(sb),
             self.counters, step.pos0, step.table, step.table_off, np.int32(blocks_y), np.int32(kv_div), log2(block),
             np.float32(math.log2(math.e) / math.sqrt(d)), np.int32(splits)))
        out = out.reshape(seqs, heads * d)
        return Row8(out, units, sb) if q8 else out
