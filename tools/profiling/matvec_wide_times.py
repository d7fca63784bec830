"""The quantized batched matvec (quant.cu, matvec_<T>_n<NB>) for launches of more than 8 rows of x,
compiled with 2, 4 and 8 weight rows per warp (MV_WIDE_ROWS): its time per launch on the
Llama-3-8B decode shapes, and that the choice changes no bit (each row of a 16-row launch equal to
that row alone, whatever the rows per warp).

    python tools/profiling/matvec_wide_times.py [--json FILE]

Exit status 0 when every output is identical.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from engine.core.quantized import row_bytes  # noqa: E402
from tools.device.mmv_check import timed  # noqa: E402

SHAPES = {"wqkv": (6144, 4096), "w_gate_up": (28672, 4096), "w_down": (4096, 14336), "head": (128256, 4096)}
KINDS = ("Q4_K", "Q6_K")
WIDE = (2, 4, 8)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json")
    a = p.parse_args()
    import cupy as cp

    from engine.kernels import MATVEC_THREADS, OPTIONS, GpuKernels, kernel_source

    kernels = GpuKernels(cp)
    modules = {r: cp.RawModule(code=kernel_source("quant.cu"), options=OPTIONS + (f"-DMV_WIDE_ROWS={r}",))
               for r in WIDE}
    rng = np.random.default_rng(0)
    out, ok = {}, True
    for kind in KINDS:
        for name, (m, k) in SHAPES.items():
            w = cp.asarray(rng.integers(0, 256, (m, row_bytes(kind, k)), dtype=np.uint8) & 0x3F)  # sane scales
            xq = kernels.quantize_q8(cp.asarray((rng.standard_normal(16 * k) * 0.1).astype(np.float16)))
            alone = cp.empty((16, m), dtype=cp.float32)
            one = modules[2].get_function(f"matvec_{kind}_n1_f32")
            for b in range(16):
                one(((m + 7) // 8,), (MATVEC_THREADS,), (w, xq[b * (k // 32):], alone[b], np.int32(m), np.int32(k),
                                                         np.int32(m), np.int32(0)))  # rows read directly
            row = {}
            for r, module in modules.items():
                fn = module.get_function(f"matvec_{kind}_n16_f32")
                y = cp.empty((16, m), dtype=cp.float32)
                grid = ((m + 4 * r - 1) // (4 * r),)
                launch = lambda: fn(grid, (MATVEC_THREADS,), (w, xq, y, np.int32(m), np.int32(k), np.int32(m), np.int32(0)))  # noqa: E731
                launch()
                same = bool(cp.array_equal(y, alone))
                ok &= same
                row[f"rows_per_warp_{r}"] = {"us": round(timed(cp, launch) * 1000, 1), "equal_alone": same}
            out[f"{kind} {name} {m}x{k}"] = row
            print(kind, name, json.dumps(row), flush=True)
    print("ALL EQUAL" if ok else "MISMATCH")
    if a.json:
        Path(a.json).write_text(json.dumps({"rows": out, "ok": ok}, indent=1) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
