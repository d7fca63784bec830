"""Issue 48's probe on the GPU: engine/kernels/dqmm.cu (quantized weights decoded to fp16 in registers, fp16 rows of
x, the products added by the fp16 tensor cores) against the kernels a decode step takes today (GpuKernels.matvec
over 8-bit rows: the dp4a matvec below MMQ_FROM rows, mmq.cu from there).

1. Each row of x gets the same bits alone (nb = 1) as among 2-64 rows, in every n-tile kernel, fp32 and fp16 out,
   for Q4_K, Q6_K and Q8_0 on odd shapes and the 8B's.
2. Accuracy: each kernel's largest error against the exact product of gguf's weight values and x (fp16), relative
   to the largest output (dqmm rounds the weights to fp16, today's kernels round x to 8 bits).
3. Time per launch on the Llama-3-8B Q4_K_M decode shapes at 1-64 rows beside the engine's, the weight bytes per
   second each reaches, a layer's matrices summed (x 32, plus the head) as a forward's matmul time, and the knobs
   (DQ_WARPS: the units' split, which changes bits; DQ_WIDE_G, DQ_WIDE_R, DQ_UNROLL: tiles a warp, groups a block,
   units in flight, which do not).

    python tools/device/dqmm_check.py [--json FILE] [--quick]

Exit status 0 when every bit check passes.
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

LAYER = {"wqkv": ("Q4_K", 6144, 4096), "wo": ("Q4_K", 4096, 4096), "w_gate_up": ("Q4_K", 28672, 4096),
         "w_down": ("Q6_K", 4096, 14336)}  # Q4_K_M: w_down in Q6_K (half the layers; all of them here)
HEAD = ("Q6_K", 128256, 4096)
ODD = [(37, 512), (131, 768), (300, 4096), (64, 14336)]
ROWS = (1, 2, 3, 8, 9, 17, 33, 48, 64)
TIMED_ROWS = (1, 4, 8, 16, 32, 64)
KNOBS = ("DQ_WARPS=4 DQ_WIDE_G=1", "DQ_WARPS=4 DQ_WIDE_G=4", "DQ_WARPS=4 DQ_WIDE_G=2 DQ_WIDE_R=2",
         "DQ_WARPS=4 DQ_WIDE_G=2 DQ_WIDE_R=4", "DQ_WARPS=4 DQ_WIDE_G=1 DQ_WIDE_R=4",
         "DQ_WARPS=4 DQ_WIDE_G=2 DQ_UNROLL=4", "DQ_WARPS=4 DQ_WIDE_G=2 DQ_UNROLL=16", "DQ_WARPS=8 DQ_WIDE_G=2",
         "DQ_WARPS=8 DQ_WIDE_G=1")
DEFAULT = "DQ_WARPS=4 DQ_WIDE_G=2"


def n_tiles(n: int) -> int:
    return next(t for t in (1, 2, 4, 8) if 8 * t >= n)


def today(kernels, kind, data, m, k, xq8, y, n) -> None:
    """The launcher GpuKernels.matvec picks for n rows of x in 8 bits (xq8), without its Python around it: the dp4a
    matvec below MMQ_FROM rows, mmq.cu from there."""
    if n >= kernels.mmq_from:
        kernels.mmq(kind, data, m, k, xq8, y, m, n)
    else:
        kernels.matvec_dp4a(kind, data, m, k, xq8, y, m, n)


class Dqmm:
    """dqmm.cu built with a knob set: launch(kind, data, m, k, x, y, n)."""

    def __init__(self, cp, defines: str):
        from engine.kernels import OPTIONS, kernel_source
        knobs = dict(d.split("=") for d in defines.split())
        self.cp, self.warps, self.wide = cp, int(knobs.get("DQ_WARPS", 4)), int(knobs.get("DQ_WIDE_G", 2))
        self.groups = int(knobs.get("DQ_WIDE_R", 1))
        options = OPTIONS + tuple(f"-D{d}" for d in defines.split())
        self.module = cp.RawModule(code=kernel_source("dqmm.cu"), options=options)
        self.fns = {}

    def launch(self, kind, data, m, k, x, y, n):
        nt = n_tiles(n)
        name = f"dqmm_{kind}_t{nt}" + ("_f32" if y.dtype == np.float32 else "")
        fn = self.fns.get(name) or self.fns.setdefault(name, self.module.get_function(name))
        g, r = (self.wide, self.groups) if nt >= 4 else (1, 1)
        fn((-(-m // (16 * g * r)),), (32 * self.warps * r,),
           (data, x, y, np.int32(m), np.int32(k), np.int32(m), np.int32(n)))


def arguments(doc: str) -> argparse.Namespace:
    """A probe's flags: --json FILE (its report), --quick (the bit checks only)."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json")
    p.add_argument("--quick", action="store_true", help="the bit checks only")
    return p.parse_args()


def report(cp, path, kernels, ok: bool, **parts) -> int:
    """The verdict printed, the report written (with the device and the engine's MMQ_FROM) where asked; the exit
    status."""
    print("ALL PASS" if ok else "FAILED")
    if path:
        Path(path).write_text(json.dumps({**parts, "ok": ok, "mmq_from": kernels.mmq_from,
                                          "device": cp.cuda.runtime.getDeviceProperties(0)["name"].decode()},
                                         indent=1) + "\n")
    return 0 if ok else 1


def main() -> int:
    a = arguments(__doc__)
    import cupy as cp
    from gguf import GGMLQuantizationType as Q
    from gguf.quants import dequantize

    from engine.core.quantized import QuantMatrix, QuantPart, row_bytes
    from engine.kernels import GpuKernels
    from tools.fixtures.make_synthetic_gguf import random_blocks

    kernels = GpuKernels(cp)
    dq = Dqmm(cp, DEFAULT)
    rng = np.random.default_rng(7)
    ok, checks, times, knobs = True, [], {}, {}

    # ---- 1, 2: bits alone = in a batch; errors against the exact product
    for kind in ("Q4_K", "Q6_K", "Q8_0"):
        for rows, cols in ODD + [(6144, 4096)]:
            raw = random_blocks(rng, Q[kind], rows, cols, 0.02)
            ref = dequantize(raw, Q[kind]).astype(np.float64)
            data = cp.asarray(raw)
            x = (rng.standard_normal((max(ROWS), cols)) * 0.5).astype(np.float16)
            xd = cp.asarray(x)
            exact = x.astype(np.float64) @ ref.T  # (rows of x, rows)
            scale = max(float(np.abs(exact).max()), 1e-30)
            alone = {}
            for dt in (np.float32, np.float16):
                y = cp.full((max(ROWS), rows), np.nan, dtype=dt)
                for b in range(max(ROWS)):
                    dq.launch(kind, data, rows, cols, xd[b:], y[b:], 1)
                alone[dt] = y.get()
            matrix = QuantMatrix((QuantPart(kind, data, rows),), cols)
            units = cols // 32
            xq = kernels.quantize_q8(cp.asarray(x.reshape(-1)))
            today_rows = kernels.matvec(matrix, xd, np.float32, xq[:max(ROWS) * units]).get()
            err_dq = float(np.abs(alone[np.float32] - exact).max()) / scale
            err_today = float(np.abs(today_rows - exact).max()) / scale
            same = {}
            for n in ROWS:
                for dt in (np.float32, np.float16):
                    y = cp.full((n, rows), np.nan, dtype=dt)
                    dq.launch(kind, data, rows, cols, xd, y, n)
                    same[(n, np.dtype(dt).name)] = bool(np.array_equal(y.get(), alone[dt][:n]))
            good = all(same.values()) and err_dq < 5e-3
            ok &= good
            checks.append({"kind": kind, "m": rows, "k": cols, "rows_equal_alone": sum(same.values()),
                           "cases": len(same), "max_rel_err_dqmm": err_dq, "max_rel_err_today": err_today})
            print(("" if good else "FAIL ") + json.dumps(checks[-1]), flush=True)
    print(f"{sum(c['rows_equal_alone'] == c['cases'] for c in checks)}/{len(checks)} shapes: every row of x the bits "
          "it has alone", flush=True)
    if a.quick:
        return report(cp, a.json, kernels, ok, checks=checks)

    # ---- 3: time per launch on the 8B shapes, beside the engine's kernels (8-bit x given, as its producers write it)
    shapes = dict(LAYER, head=HEAD)
    mats = {}
    for name, (kind, m, k) in shapes.items():
        data = cp.asarray(rng.integers(0, 256, (m, row_bytes(kind, k)), dtype=np.uint8) & 0x3F)  # sane scales
        x = cp.asarray((rng.standard_normal((64, k)) * 0.5).astype(np.float16))
        mats[name] = (kind, m, k, data, x, kernels.quantize_q8(x.reshape(-1)))
    for name, (kind, m, k, data, x, xq) in mats.items():
        w_bytes = m * row_bytes(kind, k)
        row = {}
        for n in TIMED_ROWS:
            y = cp.empty((n, m), dtype=cp.float16)
            dq_ms = timed(cp, lambda: dq.launch(kind, data, m, k, x, y, n))
            today_ms = timed(cp, lambda: today(kernels, kind, data, m, k, xq, y, n))
            row[n] = {"dqmm_us": round(dq_ms * 1e3, 1), "today_us": round(today_ms * 1e3, 1),
                      "dqmm_TBps": round(w_bytes / dq_ms / 1e9, 2), "today_TBps": round(w_bytes / today_ms / 1e9, 2)}
        times[f"{kind} {name} {m}x{k}"] = row
        print(kind, name, json.dumps(row), flush=True)
    forward = {}
    for n in TIMED_ROWS:
        f = {key: 32 * sum(times[f"{kd} {nm} {m}x{k}"][n][key] for nm, (kd, m, k) in LAYER.items())
             + times[f"{HEAD[0]} head {HEAD[1]}x{HEAD[2]}"][n][key] for key in ("dqmm_us", "today_us")}
        forward[n] = {"dqmm_ms": round(f["dqmm_us"] / 1e3, 2), "today_ms": round(f["today_us"] / 1e3, 2)}
    print("a forward's matmuls (32 layers + head), ms:", json.dumps(forward), flush=True)

    # ---- the knobs: time (w_gate_up, w_down), and whether the bits move (DQ_WARPS changes the order; G must not)
    for label in KNOBS:
        try:
            kq = Dqmm(cp, label)
            row = {}
            for name in ("w_gate_up", "w_down"):
                kind, m, k, data, x, _ = mats[name]
                for n in (1, 16, 64):
                    y, want = cp.empty((n, m), dtype=cp.float16), cp.empty((n, m), dtype=cp.float16)
                    kq.launch(kind, data, m, k, x, y, n)
                    dq.launch(kind, data, m, k, x, want, n)
                    row[f"{name} {n}"] = {"us": round(timed(cp, lambda: kq.launch(kind, data, m, k, x, y, n)) * 1e3, 1),
                                          "equal_default": bool(cp.array_equal(y, want))}
            if "DQ_WARPS=4" in label:  # the same order as the default: the bits must not move
                ok &= all(v["equal_default"] for v in row.values())
        except Exception as e:  # a shape that does not build or launch is reported
            row = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
        knobs[label] = row
        print(label, json.dumps(row), flush=True)

    return report(cp, a.json, kernels, ok, checks=checks, times=times, forward=forward, knobs=knobs, default=DEFAULT)


if __name__ == "__main__":
    sys.exit(main())
