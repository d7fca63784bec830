"""Every GPU kernel against its NumPy reference over odd shapes, then what the big ones reach.

    python tools/device/gpu_kernels_check.py [--json OUT] [--no-speed] [--only attention,q8_cache,...]
        [--define NAME=VALUE] [--block-sweep 64,0]

Correctness: flash attention (head widths 64, 128 and 256, GQA ratios 1, 3, 4, 8, one token, lengths
that are not multiples of the tile, prefixes that end mid-tile; prompt chunks through every prompt
kernel the device has: the wgmma one and the mma.sync one on Hopper), add+RMSNorm, RoPE+KV write,
SwiGLU; for every GGUF weight type the load-time expansion, the embedding gather and the matvec
that reads the blocks, against the gguf package; the MoE routing and expert kernels against
engine/ops/moe.py; the GPU sampler against the host's. Inputs are fresh random data; outputs are poisoned (NaN) before each run, so an
unwritten element fails. Error is ||gpu - ref|| / ||ref|| with the reference in float32 on the
fp16-rounded inputs. Speed: cuBLAS fp16 GEMM on the 8B shapes (the ceiling the prefill runs
against), the attention kernel's TFLOP/s at depth, a sampler draw's wall time; per-kernel decode
times (matvecs per weight kind included) are tools/profiling/decode_kernel_times.py's.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import cupy as cp  # noqa: E402
from gguf import GGMLQuantizationType as Q  # noqa: E402
from gguf.quants import dequantize  # noqa: E402

from engine.ops.backend import ArrayOps, Step  # noqa: E402
from engine.kvcache.kv import DEFAULT_BLOCK  # noqa: E402
from engine.kernels import DEQUANT, MATVEC_PAIRS, GpuKernels  # noqa: E402
from engine.core.kv_types import Q8Array, dequantize_q8_0, quantize_q8_0  # noqa: E402
from engine.core.quantized import QuantMatrix, QuantPart, quantize_q8  # noqa: E402
from tools.checks.fused_kernels import GPU_SHAPES, fused_cases, moe_act_case, norm_case  # noqa: E402
from tools.fixtures.make_synthetic_gguf import random_blocks, random_half  # noqa: E402

REF = ArrayOps(np)
rng = np.random.default_rng(1234)
results: list[dict] = []


def rel_err(gpu, ref) -> float:
    gpu = np.asarray(cp.asnumpy(gpu) if isinstance(gpu, cp.ndarray) else gpu, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    if not np.all(np.isfinite(gpu)):
        return float("inf")
    return float(np.linalg.norm(gpu - ref) / max(np.linalg.norm(ref), 1e-30))


def record(kernel: str, case: str, err: float, tol: float) -> None:
    ok = err <= tol
    results.append({"kernel": kernel, "case": case, "rel_err": err, "tol": tol, "ok": ok})
    print(f"{'ok  ' if ok else 'FAIL'} {kernel:14s} {case:44s} rel_err {err:.2e} (tol {tol:.0e})", flush=True)


def both_ways(k: GpuKernels, switch: str, run):
    """run() with the kernels' boolean attribute `switch` (a path they may take) as it is, then off."""
    on = run()
    setattr(k, switch, False)
    try:
        return on, run()
    finally:
        setattr(k, switch, True)


def half_normal(*shape, scale=1.0) -> np.ndarray:
    return (rng.standard_normal(shape) * scale).astype(np.float16)


def paged(block: int, *seqs: np.ndarray) -> tuple:
    """Rows (kv_heads, ctx, d) of one sequence (its K, its V) -> pools (blocks, kv_heads, block, d)
    holding them in the same shuffled blocks (plus spare ones, zero), and the sequence's block
    table: what engine/kvcache/kv.py keeps. Returns (*pools, table). (A q8_0 pool's scales (kv_heads, ctx,
    d / 32) go in as rows of their own width.)"""
    kv_heads, ctx, _ = seqs[0].shape
    nb = -(-ctx // block)
    table = rng.permutation(nb + 3)[:nb].astype(np.int32)
    pools = []
    for rows in seqs:
        d = rows.shape[-1]
        padded = np.zeros((kv_heads, nb * block, d), rows.dtype)
        padded[:, :ctx] = rows
        pool = np.zeros((nb + 3, kv_heads, block, d), rows.dtype)
        pool[table] = padded.reshape(kv_heads, nb, block, d).transpose(1, 0, 2, 3)
        pools.append(pool)
    return (*pools, table)


def unpaged(pool, table, ctx: int) -> np.ndarray:
    """The inverse: a sequence's rows (kv_heads, ctx, d) from a pool (host or device; a Q8Array
    widened to float32) and its table."""
    pool = pool.dequantize() if isinstance(pool, Q8Array) else pool
    blocks = np.asarray(cp.asnumpy(pool) if isinstance(pool, cp.ndarray) else pool)[table]
    return blocks.transpose(1, 0, 2, 3).reshape(blocks.shape[1], -1, blocks.shape[3])[:, :ctx]


BLOCKS_CYCLE = (16, 64, 128, 32)  # block sizes the checks go through, case by case
KV_BLOCK = int(os.environ.get("STRATA_KV_BLOCK", DEFAULT_BLOCK))  # the block size the timings use


# ---------------------------------------------------------------- correctness

def prompt_kernels(k: GpuKernels) -> list[str]:
    """The prompt-attention kernels this device runs (the default first): sm90 and mma on Hopper."""
    return [k.prompt_attention, *(["mma"] if k.prompt_attention == "sm90" else [])]


def check_attention(k: GpuKernels) -> None:
    """Prompt chunks (n > 1) through every prompt kernel the device has, and single tokens
    (flash-decoding), including a decode grid sized for more keys than present, as a captured
    graph's bucket is."""
    default = k.prompt_attention
    for case, (d, heads, kv_heads, n, start, bucket) in enumerate([
            (64, 9, 3, 1, 0, None), (64, 9, 3, 100, 0, None), (64, 9, 3, 77, 130, None),
            (128, 32, 8, 1, 700, None), (128, 32, 8, 257, 0, None), (128, 32, 8, 64, 64, None),
            (128, 8, 8, 33, 1000, None), (128, 16, 2, 200, 50, None), (64, 4, 4, 129, 3, None),
            (128, 32, 4, 130, 4099, None), (128, 32, 8, 1, 255, None), (128, 32, 8, 1, 256, None),
            (128, 64, 8, 1, 4999, None), (64, 9, 3, 1, 63, None), (128, 32, 8, 1, 1500, 8192),
            (64, 9, 3, 1, 10, 1024), (128, 32, 8, 300, 2000, None), (128, 8, 8, 129, 127, None),
            (64, 16, 2, 520, 777, None), (128, 32, 8, 1, 9000, None), (128, 32, 8, 1, 20000, 32768),
            (256, 16, 2, 1, 700, None), (256, 16, 2, 130, 64, None), (256, 4, 2, 1, 5000, 8192),
            (256, 6, 2, 77, 0, None), (256, 5, 1, 1, 300, None)]):  # the hybrid families' 256-wide heads
        # (the last two: splits of 192 and 448 keys, multiples of 64 that are no power of two)
        block = BLOCKS_CYCLE[case % len(BLOCKS_CYCLE)]
        ctx = start + n + 13
        q = half_normal(n, heads, d)
        kc, vc, table = paged(block, half_normal(kv_heads, ctx, d), half_normal(kv_heads, ctx, d))
        ref = REF.attention(q.astype(np.float32), kc.astype(np.float32), vc.astype(np.float32), Step(n, start, (table,)))
        step = k.batch_step([table], [start], max_keys=bucket, block=block) if bucket else k.step(n, start, table)
        for kind in prompt_kernels(k) if n > 1 else [default]:
            k.prompt_attention = kind
            out = k.attention(cp.asarray(q), cp.asarray(kc), cp.asarray(vc), step)
            record("attention" + (f" {kind}" if n > 1 else ""), f"d={d} gqa={heads // kv_heads} n={n} start={start} "
                   f"block={block}" + (f" grid for {bucket}" if bucket else ""), rel_err(out, ref), 5e-3)
        k.prompt_attention = default
    check_decode_grid(k)


def check_decode_grid(k: GpuKernels) -> None:
    """A large decode batch: flash-decoding's blocks take several splits each (decode_blocks_x), and
    every output equals, bit for bit, the grid of one split a block (the same partials, merged alike)."""
    from engine.kernels import attention_launch  # where decode_blocks_x reads DECODE_BLOCKS_PER_SM

    d, heads, kv_heads, block, ctx, seqs = 128, 32, 8, 64, 3000, 64
    kc, vc, table = paged(block, half_normal(kv_heads, ctx, d), half_normal(kv_heads, ctx, d))
    starts = [int(x) for x in rng.integers(0, ctx - 1, seqs)]  # each sequence splits by its own length
    q, kc, vc = cp.asarray(half_normal(seqs, heads, d)), cp.asarray(kc), cp.asarray(vc)
    step = k.batch_step([table] * seqs, starts, block=block)
    several = k.attention(q, kc, vc, step)
    default, attention_launch.DECODE_BLOCKS_PER_SM = attention_launch.DECODE_BLOCKS_PER_SM, 1 << 30
    try:
        alone = k.attention(q, kc, vc, step)
    finally:
        attention_launch.DECODE_BLOCKS_PER_SM = default
    record("attention", f"{seqs} sequences, several splits a block = one", float((several != alone).mean()), 0.0)


def rope_inputs(n: int, heads: int, kv_heads: int, d: int, start: int, normed: bool) -> tuple:
    """A fused QKV projection of n tokens (fp16), the cos/sin tables (positions, 1, d/2) and, for
    Qwen3's per-head norms, the Q and K norm weights (else None)."""
    qkv = half_normal(n, (heads + 2 * kv_heads) * d, scale=3.0 if normed else 1.0)
    angles = np.outer(np.arange(start + n + 5), 1.0 / (10000 ** (np.arange(d // 2) * 2 / d)))
    cos, sin = np.cos(angles).astype(np.float32)[:, None, :], np.sin(angles).astype(np.float32)[:, None, :]
    norms = tuple((1 + 0.1 * rng.standard_normal(d)).astype(np.float32) for _ in range(2)) if normed else None
    return qkv, cos, sin, norms


def check_norm_rope_swiglu(k: GpuKernels) -> None:
    for n, dim in [(1, 576), (37, 4096), (5, 160)]:
        x = rng.standard_normal((n, dim)).astype(np.float32)
        delta, w = half_normal(n, dim), (1 + 0.1 * rng.standard_normal(dim)).astype(np.float32)
        x_ref = x.copy()  # (first: on the host's stand-in for CuPy, asarray is the array itself)
        ref = REF.add_rms_norm(x_ref, delta.astype(np.float32), w, 1e-5)
        xg = cp.asarray(x)
        out = k.add_rms_norm(xg, cp.asarray(delta), cp.asarray(w), 1e-5)
        record("add_rms_norm", f"n={n} dim={dim}", max(rel_err(out, ref), rel_err(xg, x_ref)), 2e-3)
        out = k.add_rms_norm(cp.asarray(x), None, cp.asarray(w), 1e-5)
        record("add_rms_norm", f"n={n} dim={dim} no delta", rel_err(out, REF.add_rms_norm(x.copy(), None, w, 1e-5)), 2e-3)
    for case, (n, heads, kv_heads, d, start, normed) in enumerate([
            (1, 9, 3, 64, 5, False), (70, 32, 8, 128, 100, False), (3, 4, 4, 64, 0, False),
            (1, 32, 4, 128, 700, True), (37, 32, 8, 128, 3, True), (5, 4, 2, 64, 0, True)]):
        block = BLOCKS_CYCLE[case % len(BLOCKS_CYCLE)]
        ctx, (qkv, cos, sin, norms) = start + n + 7, rope_inputs(n, heads, kv_heads, d, start, normed)
        nan = np.full((kv_heads, ctx, d), np.nan, np.float32)
        kc, vc, table = paged(block, nan, nan)
        kc[:], vc[:] = np.nan, np.nan
        q_ref = REF.rope_store(qkv.astype(np.float32), cos, sin, kc, vc, Step(n, start, (table,)),
                               norms and (*norms, 1e-6))
        kg, vg = cp.full(kc.shape, np.nan, cp.float16), cp.full(vc.shape, np.nan, cp.float16)
        q = k.rope_store(cp.asarray(qkv), cp.asarray(cos), cp.asarray(sin), kg, vg, k.step(n, start, table),
                         norms and (*map(cp.asarray, norms), 1e-6))
        rows = slice(start, start + n)
        k_rows, v_rows = unpaged(kg, table, ctx), unpaged(vg, table, ctx)
        err = max(rel_err(q, q_ref), rel_err(k_rows[:, rows], unpaged(kc, table, ctx)[:, rows]),
                  rel_err(v_rows[:, rows], unpaged(vc, table, ctx)[:, rows]))
        written = int((~np.isnan(np.asarray(cp.asnumpy(kg), np.float32))).sum())
        untouched = written == n * kv_heads * d  # nothing but the new rows' K was written
        record("norm_rope_store" if normed else "rope_store", f"n={n} heads={heads}/{kv_heads} d={d} start={start}",
               err if untouched else math.inf, 2e-3)
    for n, ffn in [(1, 1536), (33, 14336), (4, 96)]:
        gu = half_normal(n, 2 * ffn, scale=2.0)
        record("silu_mul", f"n={n} ffn={ffn}", rel_err(k.silu_mul(cp.asarray(gu)), REF.silu_mul(gu.astype(np.float32))), 2e-3)


def check_fused_q8(k: GpuKernels) -> None:
    """A decode row's producers (the norm, SwiGLU, flash-decoding) write its 8-bit form as they write
    it: byte for byte what quantize_q8 makes of the fp16 row they return."""
    def record_same(kernel: str, case: str, row) -> None:
        want = k.quantize_q8(row.values[0]).get()
        record(kernel, case + " q8", float((row.q8.get() != want).mean()), 0.0)

    for dim in (576, 4096):
        x, w = cp.asarray(rng.standard_normal((1, dim)).astype(np.float32)), cp.ones(dim, cp.float32)
        record_same("add_rms_norm", f"n=1 dim={dim}", k.add_rms_norm(x, cp.asarray(half_normal(1, dim)), w, 1e-5, q8=True))
    for ffn in (1536, 14336):
        record_same("silu_mul", f"n=1 ffn={ffn}", k.silu_mul(cp.asarray(half_normal(1, 2 * ffn, scale=2.0)), q8=True))
    for d, heads, kv_heads, start in [(128, 32, 8, 700), (64, 9, 3, 40), (128, 64, 8, 3000)]:
        kc, vc, table = paged(64, *(half_normal(kv_heads, start + 5, d) for _ in range(2)))
        row = k.attention(cp.asarray(half_normal(1, heads, d)), cp.asarray(kc), cp.asarray(vc), k.step(1, start, table),
                          q8=True)
        record_same("attention", f"d={d} gqa={heads // kv_heads} n=1 start={start}", row)


def check_fused(k: GpuKernels) -> None:
    """The fused decode kernels (matvec_act_<T>, matvec_norm_<T>, moe_act_<T>) give the bits of the launches they
    replace, staged and not (tools/checks/fused_kernels.py), and the norm's scale to its last bit on wide rows."""
    for kernel, case, ok in fused_cases(k, cp, shapes=GPU_SHAPES):
        record(kernel, case, 0.0 if ok else math.inf, 0.0)
    wide = np.random.default_rng(3)
    failed = sum(not norm_case(k, cp, "Q8_0", 12288, 32, wide) for _ in range(20))
    record("matvec_norm_Q8_0", "dim=12288 at fp16 midpoints, 20 rows", float(failed), 0.0)
    for kind in ("Q4_K", "Q6_K", "IQ3_S"):  # the 30B-A3B's experts (128, 8 used) and the 80B-A3B's (512, 10 used)
        for experts, ffn, used in ((128, 768, 8), (512, 512, 10)):
            for tokens in (1, 16):
                ok = moe_act_case(k.moe, cp, kind, experts, 2048, ffn, tokens, used, wide)
                record(f"moe_act_{kind}", f"{experts} experts ffn={ffn} {tokens} rows", 0.0 if ok else math.inf, 0.0)


def check_q8_cache(k: GpuKernels) -> None:
    """The q8_0 pool (engine/core/kv_types.py) on the GPU: RoPE + KV write quantizing as it stores (its
    bytes against quantize_q8_0 of the reference rows: equal but where float rounding lands a value
    on the other side of a rounding edge), flash-decoding reading the 8-bit rows and a prompt chunk's
    attention over them widened (both against NumPy's attention over the widened rows), and the
    widening itself (bit for bit)."""
    for case, (n, heads, kv_heads, d, start, normed) in enumerate([
            (1, 32, 8, 128, 700, False), (70, 9, 3, 64, 100, False), (37, 32, 8, 128, 3, True), (1, 4, 2, 64, 0, True)]):
        block = BLOCKS_CYCLE[case % len(BLOCKS_CYCLE)]
        ctx, (qkv, cos, sin, norms) = start + n + 7, rope_inputs(n, heads, kv_heads, d, start, normed)
        nan = np.full((kv_heads, ctx, d), np.nan, np.float32)
        kc, vc, table = paged(block, nan, nan)
        q_ref = REF.rope_store(qkv.astype(np.float32), cos, sin, kc, vc, Step(n, start, (table,)),
                               norms and (*norms, 1e-6))
        kg, vg = (Q8Array.zeros(kc.shape, cp) for _ in range(2))
        q = k.rope_store(cp.asarray(qkv), cp.asarray(cos), cp.asarray(sin), kg, vg, k.step(n, start, table),
                         norms and (*map(cp.asarray, norms), 1e-6))
        rows, err, moved = slice(start, start + n), rel_err(q, q_ref), 0.0
        for pool, ref_pool in ((kg, kc), (vg, vc)):
            ref_rows = unpaged(ref_pool, table, ctx)[:, rows]
            err = max(err, rel_err(unpaged(pool, table, ctx)[:, rows], ref_rows))
            want, _ = quantize_q8_0(ref_rows)
            got = unpaged(pool.q, table, ctx)[:, rows]
            moved = max(moved, float((got != want).mean()) if np.abs(got.astype(int) - want).max() <= 1 else 1.0)
        case_name = f"n={n} heads={heads}/{kv_heads} d={d} start={start}"
        record("rope_store q8", case_name + (" normed" if normed else ""), err, 1e-2)
        # normed: the kernel rounds the normalized head to fp16 before rotating (as a separate norm
        # would store it), the reference does not, so more values sit across an edge
        record("rope_store q8", case_name + " bytes off by one", moved, 0.1 if normed else 1e-2)
    for case, (d, heads, kv_heads, n, start, bucket) in enumerate([
            (128, 32, 8, 1, 700, None), (64, 9, 3, 1, 63, None), (128, 64, 8, 1, 4999, None),
            (128, 32, 8, 1, 1500, 8192), (64, 9, 3, 77, 130, None), (128, 32, 8, 257, 0, None),
            (128, 32, 4, 130, 4099, None)]):
        block = BLOCKS_CYCLE[case % len(BLOCKS_CYCLE)]
        ctx = start + n + 13
        q = half_normal(n, heads, d)
        (kq, ks), (vq, vs) = (quantize_q8_0(rng.standard_normal((kv_heads, ctx, d)).astype(np.float32)) for _ in range(2))
        kqp, ksp, vqp, vsp, table = paged(block, kq, ks, vq, vs)
        ref = REF.attention(q.astype(np.float32), dequantize_q8_0(kqp, ksp), dequantize_q8_0(vqp, vsp),
                            Step(n, start, (table,)))
        step = k.batch_step([table], [start], max_keys=bucket, block=block) if bucket else k.step(n, start, table)
        kg, vg = Q8Array(cp.asarray(kqp), cp.asarray(ksp)), Q8Array(cp.asarray(vqp), cp.asarray(vsp))
        out = k.attention(cp.asarray(q), kg, vg, step)
        record("attention q8", f"d={d} gqa={heads // kv_heads} n={n} start={start} block={block}" +
               (f" grid for {bucket}" if bucket else ""), rel_err(out, ref), 5e-3)
        if n > 1:
            held = cp.asarray(table[: -(-(start + n) // block)])
            wide = k.widen_q8_0(kg, held).get()
            want = dequantize_q8_0(kqp, ksp)[cp.asnumpy(held)].astype(np.float16)
            record("widen_q8_0", f"d={d} blocks={held.size} block={block}", float((wide != want).mean()), 0.0)


def weight_rows(kind: str, rows: int, cols: int) -> tuple[np.ndarray, np.ndarray]:
    """A random tensor of one GGUF type: (its bytes (rows, row_bytes) or fp16 values, float32 reference)."""
    if kind == "F16":
        raw = half_normal(rows, cols, scale=0.02)
        return raw, raw.astype(np.float32)
    if kind == "BF16":
        raw = random_half(rng, rows, cols, bf16=True).view(np.uint8)
    else:
        raw = random_blocks(rng, Q[kind], rows, cols, 0.02)
    return raw, dequantize(raw, Q[kind]).astype(np.float32)


def check_weights(k: GpuKernels) -> None:
    """Each GGUF type: load-time expansion, the embedding gather, and the matvec that reads the
    blocks directly (fp32 and fp16 outputs), over odd row counts and the widths models have."""
    for kind in DEQUANT:
        for rows, cols in [(37, 512), (3, 4096), (131, 768), (1, 14336)] + ([(5, 576), (9, 96)] if kind in (
                "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "BF16") else []):
            raw, ref = weight_rows(kind, rows, cols)
            record("dequant", f"{kind} {rows}x{cols}", rel_err(k.dequantize(raw, kind, (rows, cols)), ref), 1e-3)
            if kind == "BF16":
                continue
            m = QuantMatrix((QuantPart(kind, cp.asarray(raw), rows),), cols)
            x = half_normal(cols)
            want = ref @ quantize_q8(x)  # what the kernel computes: x in 8 bits per 32 values
            got = k.matvec(m, cp.asarray(x))
            record("matvec", f"{kind} {rows}x{cols}", rel_err(got, want), 1e-3)
            record("matvec", f"{kind} {rows}x{cols} fp16 out", rel_err(k.matvec(m, cp.asarray(x), np.float16), want), 2e-3)
            if rows >= 32:  # against full-precision x: the 8-bit activations' own error (llama.cpp's MMVQ
                # makes the same); over many rows, as one dot product's relative error is cancellation's
                record("matvec", f"{kind} {rows}x{cols} vs fp16 x", rel_err(got, ref @ x.astype(np.float32)), 2e-2)
            if k.stage:  # rows staged by bulk copies (where they can be) against rows read directly, 1-16 rows of x
                xs = cp.asarray(half_normal(16, cols))
                staged, direct = both_ways(k, "stage", lambda: [k.matvec(m, xs[:n]) for n in (1, 3, 16)])
                record("matvec", f"{kind} {rows}x{cols} staged = direct", float(not all(
                    cp.array_equal(a, b) for a, b in zip(staged, direct))), 0)
            ids = rng.integers(0, rows, 9)
            record("embed", f"{kind} {rows}x{cols} 9 rows", rel_err(k.embed(m, cp.asarray(ids)), ref[ids]), 1e-3)
    # a stacked matrix of three kinds (Q4_K_M's QKV with an F16 fallback part): expand and matvec
    pieces = [weight_rows(kind, rows, 1024) for kind, rows in (("Q4_K", 48), ("Q6_K", 17), ("F16", 5))]
    m = QuantMatrix(tuple(QuantPart(kind, cp.asarray(raw), len(ref)) for (raw, ref), kind in
                          zip(pieces, ("Q4_K", "Q6_K", "F16"))), 1024)
    ref = np.concatenate([r for _, r in pieces])
    k.reserve_scratch(ref.size)
    x = half_normal(1024)
    record("expand", "Q4_K+Q6_K+F16 70x1024", rel_err(k.expand(m), ref), 1e-3)
    want = np.concatenate([ref[:65] @ quantize_q8(x), ref[65:] @ x.astype(np.float32)])  # F16 rows take x as is
    record("matvec", "Q4_K+Q6_K+F16 70x1024", rel_err(k.matvec(m, cp.asarray(x)), want), 1e-3)
    for kind_a, kind_b in MATVEC_PAIRS:  # two parts in one launch (matvec2_*) against a launch each and NumPy
        for rows_a, rows_b, cols in ((48, 17, 1024), (333, 70, 4096)):
            pieces = [weight_rows(kind, rows, cols) for kind, rows in ((kind_a, rows_a), (kind_b, rows_b))]
            m = QuantMatrix(tuple(QuantPart(kind, cp.asarray(raw), len(ref)) for (raw, ref), kind in
                                  zip(pieces, (kind_a, kind_b))), cols)
            x = cp.asarray(half_normal(cols))
            paired, apart = both_ways(k, "pairs", lambda: k.matvec(m, x, np.float16))
            case = f"{kind_a}+{kind_b} {rows_a}+{rows_b}x{cols}"
            record("matvec2", f"{case} = a launch each", float(not cp.array_equal(paired, apart)), 0)
            want = np.concatenate([r for _, r in pieces]) @ quantize_q8(x.get())
            record("matvec2", case, rel_err(paired, want), 2e-3)
    for cols in (96, 4096):  # the activation quantization itself
        x = half_normal(cols, scale=3.0)
        x[:32] = 0  # an all-zero unit: scale 0, no division by it
        q8 = k.quantize_q8(cp.asarray(x)).get()
        values = q8[:, :32].view(np.int8).astype(np.float32) * q8[:, 32:36].view(np.float32)
        record("quantize_q8", f"{cols} values", rel_err(values.reshape(-1), quantize_q8(x)), 1e-5)
        sums = q8[:, 36:44].view(np.float32).reshape(-1)
        record("quantize_q8", f"{cols} values: half sums", rel_err(sums, quantize_q8(x).reshape(-1, 16).sum(1)), 1e-4)
    for rows, cols in [(49152, 576), (1000, 4096), (7, 32)]:  # plain fp16 weights (F16 files, the head)
        w, x = half_normal(rows, cols, scale=0.05), half_normal(cols)
        ref = w.astype(np.float32) @ x.astype(np.float32)
        record("matvec", f"fp16 array {rows}x{cols}", rel_err(k.matvec(cp.asarray(w), cp.asarray(x)), ref), 1e-3)


def expert_stacks(kind: str, count: int, dim: int, ffn: int):
    """Random gate, up and down expert stacks of a GGUF type (or "gate,up,down" types): (on the GPU
    in their blocks, float32 reference)."""
    from engine.core.experts import Experts, ExpertStack

    gpu, ref = [], []
    kinds = kind.split(",") if "," in kind else [kind] * 3
    for kind, (rows, cols) in zip(kinds, ((ffn, dim), (ffn, dim), (dim, ffn))):
        raw, values = weight_rows(kind, count * rows, cols)
        gpu.append(ExpertStack(kind, cp.asarray(raw), count, rows, cols))
        ref.append(ExpertStack("F32", values, count, rows, cols))
    return Experts(*gpu), Experts(*ref)


def check_moe(k: GpuKernels) -> None:
    """The MoE kernels (moe.cu) against engine/ops/moe.py: the router's choices (exactly) and weights, by
    the prompt path's two launches and by a decode step's one; a decode step's rows through their
    chosen experts (x in 8 bits, twice: before gate/up and before down), all in one launch per kernel,
    each row equal bit for bit to its decode alone; a prompt chunk grouped by expert through the tiled
    GEMMs; per weight type, chunks of odd sizes."""
    from engine.ops.moe import route, run_experts
    from engine.core.quantized import Row8

    cases = [(kind, 16, 4, 512, 256) for kind in ("Q4_0", "Q4_1", "Q5_0", "Q8_0", "Q4_K", "Q5_K", "Q6_K", "F16")]
    for kind, count, used, dim, ffn in cases + [("Q4_K", 128, 8, 2048, 768), ("F16", 8, 3, 128, 64),
                                                 ("Q4_K,Q6_K,Q5_K", 16, 4, 512, 256),  # gate and up apart
                                                 ("Q4_K", 4, 2, 512, 256), ("Q6_K", 4, 2, 512, 256)]:  # 150
        # entries an expert at n=300: more than one of moe_gemm's row tiles
        gpu, ref = expert_stacks(kind, count, dim, ffn)
        router = (rng.standard_normal((count, dim)) * 0.05).astype(np.float32)
        for n in (1, 37, 300):
            h = half_normal(n, dim)
            chosen, weights = k.moe.route(cp.asarray(h), cp.asarray(router), used, True)
            want_c, want_w = route(h.astype(np.float32) @ router.T, used, True)
            case = f"{kind} {count}x{ffn}x{dim} top-{used} n={n}"
            record("moe_route", case, float(not np.array_equal(chosen.get(), want_c)), 0)
            record("moe_route", case + " weights", rel_err(weights, want_w), 1e-5)
            want = run_experts(REF, h.astype(np.float32), ref, want_c, want_w)
            if n <= 37:  # a decode step's rows (router_route holds COUNTER_SEQUENCES of them)
                dchosen, dweights = k.moe.route(cp.asarray(h), cp.asarray(router), used, True, decode=True)
                record("router_route", case, float(not np.array_equal(dchosen.get(), want_c)), 0)
                record("router_route", case + " weights", rel_err(dweights, want_w), 1e-5)
                rows = Row8(cp.asarray(h), k.quantize_q8(cp.asarray(h.reshape(-1))))
                tol = 2e-3 if kind == "F16" else 3e-2  # x in 8 bits twice: before gate/up, before down
                out = k.moe.decode(rows, gpu, dchosen, dweights).get()
                record("moe_decode", case, rel_err(out, want), tol)
                alone = [k.moe.decode(rows.row(t), gpu, dchosen[t:t + 1], dweights[t:t + 1]).get() for t in range(n)]
                differ = sum(not np.array_equal(out[t], alone[t][0]) for t in range(n))
                record("moe_decode", case + " rows = alone", float(differ), 0)
            else:
                out = k.moe.prompt(cp.asarray(h), gpu, chosen, weights)
                record("moe_gemm", case, rel_err(out, want), 5e-3)
                picked = (0, 150, 299)  # a row alone: the bits of its row in the chunk
                alone = [k.moe.prompt(cp.asarray(h[t:t + 1]), gpu, chosen[t:t + 1], weights[t:t + 1]) for t in picked]
                differ = sum(not np.array_equal(out[t].get(), a[0].get()) for t, a in zip(picked, alone))
                record("moe_gemm", case + " rows = alone", float(differ), 0)


def check_argmax(k: GpuKernels) -> None:
    """The decode graph's greedy pick: numpy.argmax exactly, ties (the first index) included."""
    for n, ties in [(128256, False), (49152, True), (1000, True), (7, False)]:
        x = rng.standard_normal(n).astype(np.float32)
        if ties:
            x = np.round(x).astype(np.float32)  # many equal maxima
        record("argmax", f"n={n}" + (" ties" if ties else ""), float(int(k.argmax(cp.asarray(x)).get()[0]) != int(np.argmax(x))), 0)


def check_sampling(k: GpuKernels) -> None:
    """The sampler over cupy (engine.runner.sampler.pick_sorted, the penalized and constrained picks) against
    the host sampler: greedy exactly; draws agree but for exp's last-bit differences between the
    two machines' math libraries, so the agreement rate is what is checked. Then the batched draws
    (check_batch_draws)."""
    from engine.runner.sampler import Sampler, SamplingParams, pick, pick_sorted

    greedy = Sampler(SamplingParams(repeat_penalty=1.3), (5, 9, 9))
    same = sum(greedy.sample(cp.asarray(x), cp) == greedy.sample(x)
               for x in (rng.standard_normal(128256).astype(np.float32) for _ in range(20)))
    record("sample", "greedy with repeat penalty, vocab 128256", float(same != 20), 0)
    for params in (SamplingParams(temperature=0.8, top_p=0.95), SamplingParams(temperature=1.0, top_k=40, min_p=0.05),
                   SamplingParams(temperature=0.7)):
        agree = 0
        for _ in range(100):
            x = (rng.standard_normal(128256) * 2).astype(np.float32) / np.float32(params.temperature)
            u = float(rng.random())
            agree += pick_sorted(cp, cp.asarray(x), u, params) == pick(x, u, params)
        record("sample", f"draws agree, {params.temperature=} {params.top_p=} {params.top_k=}", 1 - agree / 100, 0.05)
    # the engine's draws after a decode graph: captured once per parameter set, replayed with a new u
    from engine.runner.sampling_graph import DrawGraphs
    from engine.runner.sampler import scale

    draws = DrawGraphs(cp)
    logits = cp.asarray((rng.standard_normal(128256) * 2).astype(np.float32))
    for params in (SamplingParams(temperature=0.8, top_p=0.95), SamplingParams(temperature=1.0, top_k=40, min_p=0.05),
                   SamplingParams(temperature=0.7)):
        us = rng.random(50)
        same = sum(draws.draw(logits, float(u), params) == pick_sorted(cp, scale(logits, params), float(u), params)
                   for u in us)
        record("sample", f"graph draws = launched draws, {params.temperature=} {params.top_p=} {params.top_k=}",
               float(same != 50 or not draws.capturable), 0)
    # one graph a parameter set, whatever row it picks from: other rows (a batch's, a prompt's last) copied in
    graphs = len(draws.graphs)
    rows = cp.asarray((rng.standard_normal((4, 128256)) * 3).astype(np.float32))
    for params in (SamplingParams(temperature=0.8, top_p=0.95), SamplingParams(temperature=0.7)):
        same = sum(draws.draw(row, float(u), params) == pick_sorted(cp, scale(row, params), float(u), params)
                   for row in rows for u in rng.random(10))
        record("sample", f"graph draws over 4 other rows = launched draws, {params.temperature=} {params.top_p=}",
               float(same != 40 or len(draws.graphs) != graphs), 0)
    draws.prepare(logits)  # the start-up's picks of every kind: they run (and capture) without error
    record("sample", "start-up picks of every kind captured", float(len(draws.graphs) < graphs + 6), 0)
    from dataclasses import replace

    for params in (SamplingParams(repeat_penalty=1.3, presence_penalty=0.5),
                   SamplingParams(temperature=0.8, top_p=0.95, repeat_penalty=1.2, frequency_penalty=0.3)):
        recent = tuple(int(t) for t in rng.integers(0, 128256, 64))
        graphed, launched = Sampler(replace(params, seed=7), recent), Sampler(replace(params, seed=7), recent)
        same = 0
        for _ in range(30):
            token = graphed.sample(logits, cp, draws)
            same += token == launched.sample(logits, cp)
            graphed.accept(token)
            launched.accept(token)
        record("sample", f"graph picks = launched picks with penalties, {params.temperature=} {params.top_p=}",
               float(same != 30 or not draws.capturable), 0)
    check_batch_draws(k)


def check_batch_draws(k: GpuKernels) -> None:
    """engine/runner/batch_draws.py (argmax.cu's pick_keys and pick_draw): a row's token the same alone and in
    batches of 3, 17 and 64 (bit for bit: the exactness the engine promises), the same as draw_segmented (the
    arithmetic in NumPy; an ulp of exp apart at most), agreeing with the host sampler; graphs captured. Then rows
    that all have 0 < top_k <= TOP_MAX (pick_top's select instead of the sort): the sort's very tokens, alone and in
    a batch, draw_segmented's."""
    from engine.runner.batch_draws import BatchDraws, draw_segmented
    from engine.runner.sampler import SamplingParams, pick, scale

    vocab, rows = 128256, 64
    host = (rng.standard_normal((rows, vocab)) * 2).astype(np.float32)
    for row in host:  # a few strong candidates over a broad tail, as a model's
        row[rng.choice(vocab, 30, replace=False)] += 9
    host[-1] = 0.0  # and a flat row: the draw walks the whole order
    logits = cp.asarray(host)
    mix = (SamplingParams(temperature=0.8), SamplingParams(temperature=1.0, top_p=0.9),
           SamplingParams(temperature=0.7, top_k=40, min_p=0.05), SamplingParams(temperature=1.3, min_p=0.1, top_p=0.95))
    batch = BatchDraws(cp, k, vocab)
    alone = in_batches = reference = host_agree = checked = 0
    for rep in range(3):
        us = rng.random(rows)
        params = [mix[(i + rep) % len(mix)] for i in range(rows)]
        full = batch.draw([(logits[i], params[i], float(us[i])) for i in range(rows)])
        gathered = batch.draw([(logits[i], params[i], float(us[i])) for i in range(rows)], (logits, list(range(rows))))
        in_batches += gathered == full  # the rows gathered from one matrix (a decode graph's output) in one go
        for size in (3, 17):
            part = batch.draw([(logits[i], params[i], float(us[i])) for i in range(size)])
            in_batches += part == full[:size]
        for i in range(0, rows, 3):
            checked += 1
            alone += batch.draw([(logits[i], params[i], float(us[i]))]) == [full[i]]
            scaled = scale(host[i], params[i])
            reference += draw_segmented(scaled, float(us[i]), params[i]) == full[i]
            host_agree += pick(scaled, float(us[i]), params[i]) == full[i]
    record("sample", "batched draws: a row alone = in a batch of 64, bit for bit", float(alone != checked), 0)
    record("sample", "batched draws: gathered, and batches of 3 and 17 = the same rows of 64",
           float(in_batches != 9), 0)
    record("sample", "batched draws = draw_segmented (NumPy)", 1 - reference / checked, 0.02)
    record("sample", "batched draws agree with the host sampler", 1 - host_agree / checked, 0.05)
    record("sample", "batched draws captured as graphs (1, 4, 24, 64 rows)",
           float(not batch.capturable or not {(size, False) for size in (1, 4, 24, 64)} <= set(batch.graphs)), 0)
    # pick_top (every row 0 < top_k <= TOP_MAX): the sort's tokens, alone and in a batch, = draw_segmented
    tops = (SamplingParams(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05), SamplingParams(temperature=1.0, top_k=1),
            SamplingParams(temperature=0.7, top_k=256), SamplingParams(temperature=1.2, top_k=7, top_p=0.5))
    host[-2, ::5] = host[-2].max()  # ties at the top: the first indices first, as in the sort
    logits = cp.asarray(host)
    same = top_alone = top_reference = top_checked = 0
    for rep in range(3):
        us = rng.random(rows)
        params = [tops[(i + rep) % len(tops)] for i in range(rows)]
        rows_in = [(logits[i], params[i], float(us[i])) for i in range(rows)]
        by_top = batch.draw(rows_in, (logits, list(range(rows))))
        table = cp.asarray(np.array([[p.temperature, p.top_k, p.top_p, p.min_p, float(u)] for p, u in
                                     zip(params, us)], dtype=np.float64))
        sorted_out = cp.zeros(rows, dtype=cp.int64)
        k.pick_rows(logits, table, sorted_out)  # every key sorted: the other way to the same tokens
        same += by_top == sorted_out.get().tolist()
        for i in range(0, rows, 3):
            top_checked += 1
            top_alone += batch.draw([rows_in[i]]) == [by_top[i]]
            top_reference += draw_segmented(scale(host[i], params[i]), float(us[i]), params[i]) == by_top[i]
    record("sample", "pick_top's draws = the sort's, a batch of 64, bit for bit", float(same != 3), 0)
    record("sample", "pick_top's draws: a row alone = in a batch of 64", float(top_alone != top_checked), 0)
    record("sample", "pick_top's draws = draw_segmented (NumPy)", 1 - top_reference / top_checked, 0.02)
    record("sample", "pick_top's draws captured as graphs (1 and 64 rows)",
           float(not batch.capturable or not {(1, True), (64, True)} <= set(batch.graphs)), 0)


# ---------------------------------------------------------------- speed

def median_ms(fn, repeats: int = 10) -> float:
    fn()
    times = []
    for _ in range(repeats):
        a, b = cp.cuda.Event(), cp.cuda.Event()
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(cp.cuda.get_elapsed_time(a, b))
    return float(np.median(times))


def speed(k: GpuKernels, only: set[str] | None = None) -> dict:
    """Times: cuBLAS GEMMs, attention, sampling, MoE layers (with --only, those of the named checks)."""
    out = {}
    if only is None:
        for m_, n_, k_ in [(8192, 8192, 8192), (2048, 6144, 4096), (2048, 28672, 4096), (2048, 4096, 14336)]:
            a, w = cp.asarray(half_normal(m_, k_)), cp.asarray(half_normal(n_, k_, scale=0.02))
            ms = median_ms(lambda: a @ w.T)
            out[f"gemm_{m_}x{n_}x{k_}_tflops"] = round(2 * m_ * n_ * k_ / ms / 1e9, 1)
    if only is None or "attention" in only:
        out |= attention_speed(k, KV_BLOCK)
        out |= attention_speed(k, KV_BLOCK, q8=True)
    if only is None or "sampling" in only:
        out |= sampling_speed(k)
    if only is None or "moe" in only:
        out |= moe_speed(k)
    for key, value in out.items():
        print(f"{key:40s} {value}", flush=True)
    return out


def sampling_speed(k: GpuKernels) -> dict:
    out = {}
    from engine.runner.sampling_graph import DrawGraphs
    from engine.runner.sampler import Sampler, SamplingParams

    logits, draws = cp.asarray(rng.standard_normal(128256).astype(np.float32)), DrawGraphs(cp)
    for name, params, graphs in (("greedy", SamplingParams(), None),
                                 ("top_p", SamplingParams(temperature=0.8, top_p=0.95, seed=1), None),
                                 ("top_p_graph", SamplingParams(temperature=0.8, top_p=0.95, seed=1), draws),
                                 ("top_k40_min_p_graph", SamplingParams(temperature=1.0, top_k=40, min_p=0.05), draws),
                                 ("greedy_penalized_graph", SamplingParams(repeat_penalty=1.1), draws),
                                 ("top_p_penalized_graph", SamplingParams(temperature=0.8, top_p=0.95, seed=1,
                                                                          repeat_penalty=1.1, presence_penalty=0.2), draws)):
        sampler = Sampler(params, tuple(range(100, 164)))  # 64 recent tokens for the penalties
        times = []
        for _ in range(31):
            cp.cuda.Device().synchronize()
            t = time.perf_counter()
            sampler.sample(logits, cp, graphs)
            times.append((time.perf_counter() - t) * 1e3)
        out[f"sample_{name}_vocab128256_device_ms"] = round(float(np.median(times[1:])), 3)  # the first captures
    from engine.runner.batch_draws import BatchDraws  # a step's plain draws at once: the whole call, per row count

    batch, params = BatchDraws(cp, k, 128256), SamplingParams(temperature=0.8, top_p=0.95)
    rows = cp.asarray(rng.standard_normal((64, 128256)).astype(np.float32))
    for n in (1, 16, 64):
        times = []
        for _ in range(21):
            cp.cuda.Device().synchronize()
            t = time.perf_counter()
            batch.draw([(rows[i], params, 0.5) for i in range(n)])
            times.append((time.perf_counter() - t) * 1e3)
        out[f"sample_batch{n}_top_p_vocab128256_ms"] = round(float(np.median(times[1:])), 3)
    top = SamplingParams(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05)  # the servers' defaults: pick_top
    for n in (1, 16, 64):
        times = []
        for _ in range(21):
            cp.cuda.Device().synchronize()
            t = time.perf_counter()
            batch.draw([(rows[i], top, 0.5) for i in range(n)], (rows, list(range(n))))
            times.append((time.perf_counter() - t) * 1e3)
        out[f"sample_batch{n}_top_k40_vocab128256_ms"] = round(float(np.median(times[1:])), 3)
    return out


def attention_speed(k: GpuKernels, block: int | None, q8: bool = False) -> dict:
    """Prompt attention (a 2,048-token chunk at three depths) and decode attention (one token at
    three depths), 32 query / 8 KV heads of 128, K/V in shuffled blocks of `block` positions
    (None: one block holding the whole sequence, i.e. contiguous rows); with q8, a q8_0 pool (keys
    suffixed _q8; a chunk's time includes widening its rows, decode's bandwidth counts 8-bit bytes)."""
    out, (heads, kv_heads, d, n) = {}, (32, 8, 128, 2048)
    suffix, value_bytes = ("_q8", 34 / 32) if q8 else ("", 2)

    def pools(ctx: int):
        size = block or 1 << (ctx - 1).bit_length()
        if not q8:
            kc, vc, table = paged(size, half_normal(kv_heads, ctx, d), half_normal(kv_heads, ctx, d))
            return cp.asarray(kc), cp.asarray(vc), table
        (kq, ks), (vq, vs) = (quantize_q8_0(half_normal(kv_heads, ctx, d)) for _ in range(2))
        kq, ks, vq, vs, table = paged(size, kq, ks, vq, vs)
        return Q8Array(cp.asarray(kq), cp.asarray(ks)), Q8Array(cp.asarray(vq), cp.asarray(vs)), table

    default = k.prompt_attention
    for depth in (0, 14336, 63488):
        q = cp.asarray(half_normal(n, heads, d))
        kc, vc, table = pools(depth + n)
        step = k.step(n, depth, table)
        for kind in prompt_kernels(k):  # the default kernel's keys unnamed, another's suffixed with its name
            k.prompt_attention = kind
            ms = median_ms(lambda: k.attention(q, kc, vc, step))
            flops = 4 * n * heads * d * (depth + (n + 1) / 2)  # QK^T and PV over the visible keys
            name = f"attention_chunk{n}_depth{depth}{suffix}" + ("" if kind == default else f"_{kind}")
            out[f"{name}_tflops"] = round(flops / ms / 1e9, 1)
            out[f"{name}_ms"] = round(ms, 3)
        k.prompt_attention = default
    for depth in (1024, 46832, 131071):  # one decode token: bound by reading K and V once
        kc, vc, table = pools(depth + 1)
        q, step = cp.asarray(half_normal(1, heads, d)), k.step(1, depth, table)
        ms = median_ms(lambda: k.attention(q, kc, vc, step), 50)
        out[f"decode_attention_depth{depth}{suffix}_us"] = round(ms * 1000, 1)
        out[f"decode_attention_depth{depth}{suffix}_tb_s"] = round(2 * kv_heads * (depth + 1) * d * value_bytes / ms / 1e9, 2)
    return out


def block_sweep(k: GpuKernels, sizes: list[int | None]) -> dict:
    """attention_speed per block size, f16 and q8_0 caches, side by side in one run (None: contiguous)."""
    out = {}
    for size in sizes:
        out[str(size or "contiguous")] = row = attention_speed(k, size) | attention_speed(k, size, q8=True)
        print(f"block {size or 'contiguous':>10}: " + "  ".join(f"{key.replace('attention_', '')}={value}"
                                                             for key, value in row.items() if not key.endswith("_ms")),
              flush=True)
    return out


def moe_speed(k: GpuKernels) -> dict:
    """One Qwen3-30B-A3B MoE layer (128 experts of 768 over 2048, 8 used) in Q4_K: a 2048-token
    chunk's grouped GEMMs (TFLOP/s over the chosen experts' work) and a decode row (GB/s over the
    chosen experts' bytes)."""
    from engine.core.quantized import Row8, row_bytes

    out, (count, used, dim, ffn) = {}, (128, 8, 2048, 768)
    gpu, _ = expert_stacks("Q4_K", count, dim, ffn)
    router = cp.asarray((rng.standard_normal((count, dim)) * 0.05).astype(np.float32))
    h = cp.asarray(half_normal(2048, dim))
    chosen, weights = k.moe.route(h, router, used, True)
    ms = median_ms(lambda: k.moe.prompt(h, gpu, chosen, weights))
    out["moe_layer_30b_a3b_q4_k_chunk2048_ms"] = round(ms, 3)
    out["moe_layer_30b_a3b_q4_k_chunk2048_tflops"] = round(2 * 2048 * used * 3 * ffn * dim / ms / 1e9, 1)
    out["moe_layer_30b_a3b_q4_k_chunk2048_route_ms"] = round(median_ms(lambda: k.moe.route(h, router, used, True)), 3)
    row = Row8(h[:1], k.quantize_q8(h[0]))
    c1, w1 = k.moe.route(h[:1], router, used, True, decode=True)
    ms = median_ms(lambda: k.moe.decode(row, gpu, c1, w1), 50)
    out["moe_layer_30b_a3b_q4_k_decode_us"] = round(ms * 1000, 1)
    out["moe_layer_30b_a3b_q4_k_decode_tb_s"] = round(used * 3 * ffn * row_bytes("Q4_K", dim) / ms / 1e9, 2)
    out["moe_layer_30b_a3b_q4_k_decode_route_us"] = round(
        median_ms(lambda: k.moe.route(h[:1], router, used, True, decode=True), 50) * 1000, 1)
    for n in (16, 64):  # a decode batch in one launch per kernel, against its rows one at a time
        rows = Row8(h[:n], k.quantize_q8(h[:n].reshape(-1)))
        alone = [rows.row(t) for t in range(n)]
        for label, batches in (("", [rows]), ("_one_at_a_time", alone)):  # route and experts, as a step runs them
            out[f"moe_layer_30b_a3b_q4_k_decode_{n}_rows{label}_us"] = round(median_ms(lambda: [
                k.moe.decode(b, gpu, *k.moe.route(b.values, router, used, True, decode=True)) for b in batches],
                5) * 1000, 1)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json")
    p.add_argument("--no-speed", action="store_true")
    p.add_argument("--block-sweep", help="only time attention with K/V in blocks of these sizes (comma-separated; "
                                         "0: contiguous), side by side")
    p.add_argument("--only", help="run only these checks (comma-separated: attention, fused_q8, fused, norm_rope, "
                                   "q8_cache, weights, moe, argmax, sampling)")
    p.add_argument("--define", action="append", default=[], metavar="NAME=VALUE",
                   help="a macro for every kernel file (a kernel's variant, e.g. DEC_PREFETCH=0)")
    a = p.parse_args()
    k = GpuKernels(cp, tuple(a.define))
    print(f"prompt attention: {k.prompt_attention}", flush=True)
    if a.block_sweep:
        sweep = block_sweep(k, [int(x) or None for x in a.block_sweep.split(",")])
        if a.json:
            Path(a.json).write_text(json.dumps({"device": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(),
                                                "defines": a.define, "block_sweep": sweep}, indent=1) + "\n")
        return 0
    checks = {"attention": check_attention, "fused_q8": check_fused_q8, "fused": check_fused,
              "norm_rope": check_norm_rope_swiglu,
              "q8_cache": check_q8_cache, "weights": check_weights, "moe": check_moe, "argmax": check_argmax,
              "sampling": check_sampling}
    for name, check in checks.items():
        if not a.only or name in a.only.split(","):
            check(k)
    report = {"device": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(), "defines": a.define,
              "prompt_attention": k.prompt_attention, "checks": results,
              "all_ok": all(r["ok"] for r in results)}
    if not a.no_speed:
        report["speed"] = speed(k, set(a.only.split(",")) if a.only else None)
    if a.json:
        Path(a.json).write_text(json.dumps(report, indent=1) + "\n")
    print(f"{sum(r['ok'] for r in results)}/{len(results)} kernel checks passed", flush=True)
    return 0 if report["all_ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
