"""Issue 48: a decode step's producers write their rows' Q8K super-blocks (engine/kernels/q8k.cuh) where sbq.cu's
matvecs read them ($STRATA_SBQ=1), so that no quantize_q8k launch runs for them. Checked on the GPU, through the
engine's launchers: the norm (add_rms_norm), SwiGLU (silu_mul) and flash-decoding's output for the 8B shape's
widths, 1 to 64 rows, each row's super-blocks byte for byte NumPy's Q8K of the fp16 row the kernel stored
(tools/device/sbq_check.py q8k), and a width or a head group that is not whole super-blocks given none.

    python tools/device/q8k_check.py [--json OUT]     (exit status 1 on any failure)
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tools.device.sbq_check import q8k  # noqa: E402

FILLED = 276  # a Q8K block's bytes that carry something (q, the units' sums, d); the rest is padding
SHAPES = {"dim": 4096, "ffn": 14336, "head_dim": 128, "heads": 32, "kv_heads": 8, "block": 64}  # the 8B's


def same(row8) -> bool:
    values = row8.values.get() if hasattr(row8.values, "get") else row8.values
    blocks = row8.q8k.get() if hasattr(row8.q8k, "get") else row8.q8k
    return bool(np.array_equal(blocks[..., :FILLED], q8k(values.reshape(len(values), -1))[..., :FILLED]))


def main(argv=None, cp=None, kernels=None, shapes: dict | None = None) -> int:
    """On the GPU by default; a dry run on the host passes cp (NumPy), kernels (launchers over host kernels) and
    smaller shapes."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json")
    a = p.parse_args(argv)
    if cp is None:
        import cupy as cp
    if kernels is None:
        from engine.kernels import GpuKernels
        kernels = GpuKernels(cp)
    kernels.sbq = True
    s, rng, results = shapes or SHAPES, np.random.default_rng(3), []

    def record(name: str, ok: bool, **detail) -> None:
        results.append({"name": name, "ok": ok, **detail})
        print(("ok   " if ok else "FAIL ") + name, json.dumps(detail), flush=True)

    dim, ffn = s["dim"], s["ffn"]
    w = cp.asarray((1 + 0.1 * rng.standard_normal(dim)).astype(np.float32))
    for n in (1, 3, 64):
        x = rng.standard_normal((n, dim)).astype(np.float32)
        x[0] *= 1e-3  # small values: d far from 1
        out = kernels.add_rms_norm(cp.asarray(x), cp.asarray(rng.standard_normal((n, dim)).astype(np.float16)), w,
                                   1e-5, q8=True)
        record("add_rms_norm", out.q8k is not None and same(out), rows=n, dim=dim)
        act = kernels.silu_mul(cp.asarray((2 * rng.standard_normal((n, 2 * ffn))).astype(np.float16)), q8=True)
        record("silu_mul", act.q8k is not None and same(act), rows=n, ffn=ffn)
    narrow = kernels.silu_mul(cp.asarray(rng.standard_normal((2, 2 * 96)).astype(np.float16)), q8=True)
    record("silu_mul, a width of 96: none", narrow.q8k is None)

    d, heads, kv_heads, block = s["head_dim"], s["heads"], s["kv_heads"], s["block"]
    for n, length in ((1, 100), (8, 700), (64, 3000)):
        positions = tuple(int(p) for p in rng.integers(length // 2, length, n))
        tables, at = [], 0
        for pos in positions:
            tables.append(list(range(at, at + pos // block + 1)))
            at += pos // block + 1
        pools = [cp.asarray(rng.standard_normal((at, kv_heads, block, d)).astype(np.float16)) for _ in range(2)]
        step = kernels.batch_step(tables, positions)
        q = cp.asarray(rng.standard_normal((n, heads, d)).astype(np.float16))
        out = kernels.decode_attention(q, *pools, step, q8=True)
        record("decode attention", out.q8k is not None and same(out), rows=n, head_dim=d, group=heads // kv_heads)
    failed = [r for r in results if not r["ok"]]
    print(f"{len(results) - len(failed)}/{len(results)} ok" + ("" if failed else ": ALL PASS"))
    if a.json:
        Path(a.json).write_text(json.dumps({"results": results}, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
