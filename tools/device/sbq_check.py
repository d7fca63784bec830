"""Issue 48's third probe on the GPU: engine/kernels/sbq.cu (Q4_K and Q6_K weights against x in Q8K, integer sums
over a super-block and one float step after, one chain an output) against the kernels a decode step takes today
(GpuKernels' dp4a matvec below MMQ_FROM rows, mmq.cu from there, x in 8 bits a unit of 32).

1. quantize_q8k's blocks equal their NumPy form (q8k below), byte for byte.
2. Each row of x gets the solo kernel's bits (sbq_<kind>_n1) among 1-64 rows in every n-tile kernel.
3. Accuracy: each route's largest error against the exact product of gguf's weights and x (fp16), relative to the
   largest output (Q8K rounds x with one scale a super-block, today's form one a unit of 32).
4. Time per launch on the Llama-3-8B Q4_K_M decode shapes (w_down and the head in Q6_K) at 1-64 rows beside today's
   kernels, a forward's matmuls summed, and the block's warps as a knob (it changes no bit).

    python tools/device/sbq_check.py [--json FILE] [--quick]

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

from engine.kernels.matvec_launch import tiles  # noqa: E402


Q8K_BYTES = 288
SHAPES = {"wqkv": ("Q4_K", 6144, 4096), "wo": ("Q4_K", 4096, 4096), "w_gate_up": ("Q4_K", 28672, 4096),
          "w_down": ("Q6_K", 4096, 14336), "head": ("Q6_K", 128256, 4096)}
ODD = [(37, 512), (131, 768), (300, 4096), (64, 14336)]
ROWS = (1, 2, 3, 8, 9, 17, 33, 48, 64)
TIMED_ROWS = (1, 4, 8, 16, 32, 64)


def q8k(x: np.ndarray) -> np.ndarray:
    """x (n, k) fp16 -> (n, k / 256, 288) uint8, sbq.cu's Q8K: q = rint(x / d) (256 int8), each unit of 32's sum of
    q (8 int16), d = max |x| / 127 (float32), 12 bytes of padding."""
    n, k = x.shape
    v = x.astype(np.float32).reshape(n, k // 256, 256)
    d = (np.abs(v).max(axis=-1) / np.float32(127)).astype(np.float32)
    safe = np.where(d > 0, d, np.float32(1))[..., None]
    q = np.where(d[..., None] > 0, np.rint(v / safe), 0).astype(np.int8)
    out = np.zeros((n, k // 256, Q8K_BYTES), dtype=np.uint8)
    out[..., :256] = q.view(np.uint8)
    out[..., 256:272] = q.reshape(n, k // 256, 8, 32).astype(np.int32).sum(-1).astype(np.int16).view(np.uint8)
    out[..., 272:276] = d[..., None].view(np.uint8)
    return out

def today(kernels, kind, data, m, k, xq8, y, n) -> None:
    """The launcher GpuKernels.matvec picks for n rows of x in 8 bits (xq8), without its Python around it: the dp4a
    matvec below MMQ_FROM rows, mmq.cu from there."""
    if n >= kernels.mmq_from:
        kernels.mmq(kind, data, m, k, xq8, y, m, n)
    else:
        kernels.matvec_dp4a(kind, data, m, k, xq8, y, m, n)


def arguments(doc: str) -> argparse.Namespace:
    """The check's flags: --json FILE (its report), --quick (the bit checks only)."""
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


class Sbq:
    """sbq.cu's kernels: quantize(x) -> Q8K blocks, solo(kind, data, m, k, xq_row, y_row), tiles(kind, data, m, k,
    xq, y, n)."""

    def __init__(self, cp, warps: int = 4):
        from engine.kernels import OPTIONS, kernel_source
        self.cp, self.warps = cp, warps
        module = cp.RawModule(code=kernel_source("sbq.cu"), options=OPTIONS)
        self.fn = {name: module.get_function(name)
                   for name in ("quantize_q8k", *(f"sbq_{kind}_{v}{suffix}" for kind in ("Q4_K", "Q6_K")
                                                    for v in ("n1", "t1", "t2", "t4", "t8")
                                                    for suffix in ("", "_f32")))}

    def quantize(self, x):
        n, k = x.shape
        out = self.cp.zeros((n, k // 256, Q8K_BYTES), dtype=self.cp.uint8)
        blocks = n * k // 256
        self.fn["quantize_q8k"](((blocks * 32 + 127) // 128,), (128,), (x, out, np.int32(blocks)))
        return out

    def solo(self, kind, data, m, k, xq, y):
        suffix = "_f32" if y.dtype == np.float32 else ""
        self.fn[f"sbq_{kind}_n1{suffix}"](((m + self.warps - 1) // self.warps,), (32 * self.warps,),
                                          (data, xq, y, np.int32(m), np.int32(k)))

    def tiles(self, kind, data, m, k, xq, y, n):
        rows, suffix = 16 * self.warps, "_f32" if y.dtype == np.float32 else ""
        self.fn[f"sbq_{kind}_t{tiles(n, (1, 2, 4, 8))}{suffix}"](((m + rows - 1) // rows,), (32 * self.warps,),
                                                     (data, xq, y, np.int32(m), np.int32(k), np.int32(m), np.int32(n)))


def main() -> int:
    a = arguments(__doc__)
    import cupy as cp
    from gguf import GGMLQuantizationType as Q
    from gguf.quants import dequantize

    from engine.core.quantized import QuantMatrix, QuantPart, row_bytes
    from engine.kernels import GpuKernels
    from tools.device.mmv_check import timed
    from tools.fixtures.make_synthetic_gguf import random_blocks

    kernels = GpuKernels(cp)
    sbq = Sbq(cp)
    rng = np.random.default_rng(7)
    ok, checks, times, knobs = True, [], {}, {}

    # ---- 1-3: the x form, bits alone = in a batch, errors against the exact product
    for kind, rows, cols in [(kd, r, c) for kd in ("Q4_K", "Q6_K") for r, c in ODD] + [SHAPES["wqkv"],
                                                                                       SHAPES["w_down"]]:
        raw = random_blocks(rng, Q[kind], rows, cols, 0.02)
        ref = dequantize(raw, Q[kind]).astype(np.float64)
        data = cp.asarray(raw)
        x = (rng.standard_normal((max(ROWS), cols)) * 0.5).astype(np.float16)
        xd = cp.asarray(x)
        xq = sbq.quantize(xd)
        form_same = bool(np.array_equal(xq.get(), q8k(x)))
        exact = x.astype(np.float64) @ ref.T
        scale = max(float(np.abs(exact).max()), 1e-30)
        alone = cp.full((max(ROWS), rows), np.nan, dtype=cp.float32)
        for b in range(max(ROWS)):
            sbq.solo(kind, data, rows, cols, xq[b], alone[b])
        alone = alone.get()
        matrix = QuantMatrix((QuantPart(kind, data, rows),), cols)
        today_rows = kernels.matvec(matrix, xd, np.float32).get()
        same = {}
        for n in ROWS:
            y = cp.full((n, rows), np.nan, dtype=cp.float32)
            sbq.tiles(kind, data, rows, cols, xq, y, n)
            same[n] = bool(np.array_equal(y.get(), alone[:n]))
        err_sbq, err_today = (float(np.abs(v - exact).max()) / scale for v in (alone, today_rows))
        good = form_same and all(same.values()) and err_sbq < 2e-2
        ok &= good
        checks.append({"kind": kind, "m": rows, "k": cols, "q8k_form_equal": form_same,
                       "rows_equal_alone": sum(same.values()), "cases": len(same), "max_rel_err_sbq": err_sbq,
                       "max_rel_err_today": err_today})
        print(("" if good else "FAIL ") + json.dumps(checks[-1]), flush=True)
    print(f"{sum(c['rows_equal_alone'] == c['cases'] for c in checks)}/{len(checks)} shapes: every row of x the solo "
          "kernel's bits", flush=True)
    if a.quick:
        return report(cp, a.json, kernels, ok, checks=checks)

    # ---- 4: time per launch, beside today's launchers (x given in each route's form, as a producer writes it)
    mats = {}
    for name, (kind, m, k) in SHAPES.items():
        data = cp.asarray(rng.integers(0, 256, (m, row_bytes(kind, k)), dtype=np.uint8) & 0x3F)  # sane scales
        x = cp.asarray((rng.standard_normal((64, k)) * 0.5).astype(np.float16))
        mats[name] = (kind, m, k, data, kernels.quantize_q8(x.reshape(-1)), sbq.quantize(x))
    for name, (kind, m, k, data, xq8, xk) in mats.items():
        w_bytes = m * row_bytes(kind, k)
        row = {}
        for n in TIMED_ROWS:
            y, y32 = cp.empty((n, m), dtype=cp.float16), cp.empty((n, m), dtype=cp.float32)
            if n == 1:
                sbq_ms = timed(cp, lambda: sbq.solo(kind, data, m, k, xk[0], y32[0]))
            else:
                sbq_ms = timed(cp, lambda: sbq.tiles(kind, data, m, k, xk, y32, n))
            today_ms = timed(cp, lambda: today(kernels, kind, data, m, k, xq8, y, n))
            row[n] = {"sbq_us": round(sbq_ms * 1e3, 1), "today_us": round(today_ms * 1e3, 1),
                      "sbq_TBps": round(w_bytes / sbq_ms / 1e9, 2), "today_TBps": round(w_bytes / today_ms / 1e9, 2)}
        times[name] = row
        print(kind, name, json.dumps(row), flush=True)
    forward = {}
    for n in TIMED_ROWS:
        f = {key: 32 * sum(times[nm][n][key] for nm in ("wqkv", "wo", "w_gate_up", "w_down")) + times["head"][n][key]
             for key in ("sbq_us", "today_us")}
        forward[n] = {"sbq_ms": round(f["sbq_us"] / 1e3, 2), "today_ms": round(f["today_us"] / 1e3, 2)}
    print("a forward's matmuls (32 layers + head), ms:", json.dumps(forward), flush=True)
    kind, m, k, data, _, xk = mats["w_gate_up"]
    for warps in (2, 8):
        kq, row = Sbq(cp, warps), {}
        for n in (1, 16, 64):
            y = cp.empty((n, m), dtype=cp.float32)
            want = cp.empty((n, m), dtype=cp.float32)
            run = ((lambda: kq.solo(kind, data, m, k, xk[0], y[0])) if n == 1
                   else (lambda: kq.tiles(kind, data, m, k, xk, y, n)))
            run()
            if n == 1:
                sbq.solo(kind, data, m, k, xk[0], want[0])
            else:
                sbq.tiles(kind, data, m, k, xk, want, n)
            row[n] = {"us": round(timed(cp, run) * 1e3, 1), "equal_default": bool(cp.array_equal(y, want))}
            ok &= row[n]["equal_default"]
        knobs[f"{warps} warps a block"] = row
        print("w_gate_up", warps, "warps a block", json.dumps(row), flush=True)

    return report(cp, a.json, kernels, ok, checks=checks, times=times, forward=forward, knobs=knobs)


if __name__ == "__main__":
    sys.exit(main())
