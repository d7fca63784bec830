"""The quantized matvec on the int8 tensor cores (engine/kernels/mmq.cu) on the GPU: every row it
gives must equal, bit for bit, the dp4a matvec's row for the same row of x alone (quant.cu
matvec_<T>_n1: a decode step of one sequence), in fp32 and fp16 output, for every kind the engine
keeps quantized, odd shapes and 1-256 rows of x; the engine's own dispatch (GpuKernels.matvec, which
takes mmq.cu from MMQ_FROM rows) likewise; and within 1e-3 of NumPy. Then its time per launch on the
Llama-3-8B decode shapes at 1-64 rows beside the dp4a kernels it replaces (16 rows a launch), with
the weight bytes per second each reaches, and the block's shape (MMQ_WARPS, MMQ_MT, MMQ_STAGES) as knobs.

    python tools/device/mmq_check.py [--json FILE] [--quick] [--time-kinds Q4_K,Q6_K] [--no-knobs]

Exit status 0 when every check passes.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tools.device.mmv_check import timed  # noqa: E402

SHAPES = {"wqkv": (6144, 4096), "wo": (4096, 4096), "w_gate_up": (28672, 4096), "w_down": (4096, 14336),
          "head": (128256, 4096)}
ODD = [(37, 512), (131, 768), (5, 14336), (300, 4096), (17, 96), (64, 576)]
ROWS = (1, 2, 3, 8, 9, 17, 33, 48, 64, 70, 129, 256)
TIMED_ROWS = (1, 4, 8, 16, 32, 64)
KNOBS = ((16, 1, 4), (16, 4, 4), (16, 2, 2), (16, 2, 3), (16, 2, 6))  # (MMQ_WARPS, MMQ_MT, MMQ_STAGES) timed beside the default


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json")
    p.add_argument("--quick", action="store_true", help="correctness only, no timing")
    p.add_argument("--time-kinds", default="Q4_K,Q6_K", help="the kinds timed on the 8B shapes (comma-separated)")
    p.add_argument("--no-knobs", action="store_true", help="no timing of the block's shapes")
    a = p.parse_args()
    import cupy as cp
    from gguf import GGMLQuantizationType as Q
    from gguf.quants import dequantize

    from engine.kernels import OPTIONS, GpuKernels, kernel_source, tiles
    from engine.kernels import MMQ_TILES, mmq_grid, mmq_smem_bytes
    from engine.core.quantized import BLOCKS, QuantMatrix, QuantPart, quantize_q8, row_bytes
    from tools.fixtures.make_synthetic_gguf import random_blocks

    kernels = GpuKernels(cp)
    rng = np.random.default_rng(7)
    ok, checks, times, knobs = True, [], {}, {}

    def dp4a(kind, data, m, k, xq, n, y, suffix=""):  # the kernels the engine takes below MMQ_FROM rows
        kernels.matvec_dp4a(kind, data, m, k, xq, y, m, n, suffix)

    # ---- every row equal to the dp4a matvec's row alone; NumPy; the engine's dispatch
    for kind in BLOCKS:
        for rows, cols in ODD:
            if cols % BLOCKS[kind][0]:
                continue
            raw = random_blocks(rng, Q[kind], rows, cols, 0.02)
            ref = dequantize(raw, Q[kind]).astype(np.float64)
            data = cp.asarray(raw)
            x = (rng.standard_normal((max(ROWS), cols)) * 0.5).astype(np.float16)
            xq = kernels.quantize_q8(cp.asarray(x.reshape(-1)))
            units = cols // 32
            want = np.stack([ref @ quantize_q8(x[b]) for b in range(max(ROWS))])  # (rows of x, rows)
            alone = {}
            for dtype, suffix in ((np.float32, "_f32"), (np.float16, "")):
                y = cp.empty((max(ROWS), rows), dtype=dtype)
                for b in range(max(ROWS)):
                    dp4a(kind, data, rows, cols, xq[b * units:], 1, y[b:], suffix)
                alone[suffix] = y.get()
            matrix = QuantMatrix((QuantPart(kind, data, rows),), cols)
            for n in ROWS:
                same = {}
                for dtype, suffix in ((np.float32, "_f32"), (np.float16, "")):
                    y = cp.full((n, rows), np.nan, dtype=dtype)
                    kernels.mmq(kind, data, rows, cols, xq, y, rows, n, suffix)
                    got = y.get()
                    same[suffix or "_f16"] = bool(np.array_equal(got, alone[suffix][:n]))
                    if suffix:
                        err = float(np.max(np.abs(got - want[:n])) / max(float(np.max(np.abs(want))), 1e-30))
                engine = kernels.matvec(matrix, cp.asarray(x[:n]), np.float32, xq[:n * units]).get()
                engine_same = bool(np.array_equal(engine, alone["_f32"][:n]))
                good = err < 1e-3 and all(same.values()) and engine_same
                ok &= good
                checks.append({"kind": kind, "m": rows, "k": cols, "n": n, "max_rel_err": err,
                               "equal_dp4a_alone_f32": same["_f32"], "equal_dp4a_alone_f16": same["_f16"],
                               "engine_matvec_equal": engine_same})
                if not good:
                    print("FAIL", json.dumps(checks[-1]), flush=True)
        print(kind, "checked:", sum(c["kind"] == kind for c in checks), "cases", flush=True)
    print(f"{sum(1 for c in checks if c['equal_dp4a_alone_f32'] and c['equal_dp4a_alone_f16'])}/{len(checks)} "
          f"cases equal the dp4a matvec's rows bit for bit (engine dispatch from {kernels.mmq_from} rows)", flush=True)
    if a.quick:
        print("ALL PASS" if ok else "FAILED")
        return 0 if ok else 1

    # ---- time per launch on the 8B shapes, beside the dp4a matvec
    for kind in a.time_kinds.split(","):
        for name, (m, k) in SHAPES.items():
            if kind in ("Q8_0", "Q4_0") and name in ("wqkv", "wo"):
                continue
            w_bytes = m * row_bytes(kind, k)
            data = cp.asarray(rng.integers(0, 256, (m, row_bytes(kind, k)), dtype=np.uint8) & 0x3F)  # sane scales
            xq = kernels.quantize_q8(cp.asarray((rng.standard_normal(64 * k) * 0.5).astype(np.float16)))
            row = {}
            for n in TIMED_ROWS:
                y = cp.empty((n, m), dtype=cp.float16)
                mmq_ms = timed(cp, lambda: kernels.mmq(kind, data, m, k, xq, y, m, n))
                dp4a_ms = timed(cp, lambda: dp4a(kind, data, m, k, xq, n, y))
                row[n] = {"mmq_us": round(mmq_ms * 1e3, 1), "dp4a_us": round(dp4a_ms * 1e3, 1),
                          "mmq_TBps": round(w_bytes / mmq_ms / 1e9, 2), "dp4a_TBps": round(w_bytes / dp4a_ms / 1e9, 2)}
            times[f"{kind} {name} {m}x{k}"] = row
            print(kind, name, json.dumps(row), flush=True)

    # ---- the block's shape: time, and the bits unchanged (the order does not depend on it)
    m, k = SHAPES["w_gate_up"]
    if not a.no_knobs:
        data = cp.asarray(rng.integers(0, 256, (m, row_bytes("Q4_K", k)), dtype=np.uint8) & 0x3F)
        xq = kernels.quantize_q8(cp.asarray((rng.standard_normal(64 * k) * 0.5).astype(np.float16)))
    for warps, mt, stages in () if a.no_knobs else KNOBS:
        label = f"MMQ_WARPS={warps} MMQ_MT={mt} MMQ_STAGES={stages}"
        try:
            module = cp.RawModule(code=kernel_source("mmq.cu"), options=OPTIONS + tuple(
                f"-D{d}" for d in label.split()))
            row = {}
            for n in (4, 16, 32, 64):
                nt = tiles(min(n, 8 * MMQ_TILES[-1]), MMQ_TILES)
                fn = module.get_function(f"mmq_Q4_K_t{nt}")
                smem = mmq_smem_bytes("Q4_K", nt, warps, mt, stages)
                fn.max_dynamic_shared_size_bytes = smem
                y, want = cp.empty((n, m), dtype=cp.float16), cp.empty((n, m), dtype=cp.float16)

                def launch():
                    fn((mmq_grid(m, n, nt, kernels.sms, mt),), (32 * warps,),
                       (data, xq, y, np.int32(m), np.int32(k), np.int32(m), np.int32(n)), shared_mem=smem)
                launch()
                kernels.mmq("Q4_K", data, m, k, xq, want, m, n)
                same = bool(cp.array_equal(y, want))
                ok &= same
                row[n] = {"us": round(timed(cp, launch) * 1e3, 1), "equal_default": same}
        except Exception as e:  # a shape that does not build or launch (registers, shared memory) is reported
            row = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
        knobs[label] = row
        print("Q4_K w_gate_up", label, json.dumps(row), flush=True)

    print("ALL PASS" if ok else "FAILED")
    if a.json:
        Path(a.json).write_text(json.dumps({"checks": checks, "times": times, "knobs": knobs, "ok": ok,
                                            "mmq_from": kernels.mmq_from,
                                            "device": cp.cuda.runtime.getDeviceProperties(0)["name"].decode()},
                                           indent=1) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
