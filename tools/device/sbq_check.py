"""Issue 48's third probe on the GPU: engine/kernels/sbq.cu (Q4_K and Q6_K weights against x in Q8K, integer sums
over a super-block and one float step after, one chain an output) against the kernels a decode step takes today
(GpuKernels' dp4a matvec below MMQ_FROM rows, mmq.cu from there, x in 8 bits a unit of 32).

1. quantize_q8k's blocks equal their NumPy form (q8k below), byte for byte.
2. Each row of x gets the solo kernel's bits (sbq_<kind>_n1) among 1-64 rows in every n-tile kernel, with x's rows
   split among warps (8 and 16 a warp), with k in segments (the solo kernel's same segments), and from Q6_K repacked
   into 212-byte blocks (Q6_KP).
3. Accuracy: each route's largest error against the exact product of gguf's weights and x (fp16), relative to the
   largest output (Q8K rounds x with one scale a super-block, today's form one a unit of 32).
4. Time per launch on the Llama-3-8B Q4_K_M decode shapes (w_down and the head in Q6_K) at 1-64 rows beside today's
   kernels, each with its fraction of the chip's nearer limit (DRAM's rate for the weights or the int8 tensor rate),
   with x's rows split among warps by the grid (8, 16, 32 a warp; the same bits), a forward's matmuls
   summed (sbq's, its best splits', the same with Q6_K repacked into 212-byte blocks, each matrix by the route that
   wins at 64 rows, today's), and as knobs (neither changes a bit) the block's warps and the solo kernel's lanes a
   super-block (SBQ_SOLO_LANES, built apart).

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

from engine.kernels.matvec_launch import sbq_segments, tiles  # noqa: E402


Q8K_BYTES = 288
SHAPES = {"wqkv": ("Q4_K", 6144, 4096), "wo": ("Q4_K", 4096, 4096), "w_gate_up": ("Q4_K", 28672, 4096),
          "w_down": ("Q6_K", 4096, 14336), "head": ("Q6_K", 128256, 4096)}
ODD = [(37, 512), (131, 768), (300, 4096), (64, 14336)]
ROWS = (1, 2, 3, 8, 9, 17, 33, 48, 64)
TIMED_ROWS = (1, 4, 8, 16, 32, 64)
PARTS = (1, 2, 4, 8)  # k's segments timed (each a chain, added in order after)
SOLO_LANES = (2, 8)  # the solo kernel's other lanes a super-block timed (SBQ_SOLO_LANES, 4 by default)
CHIPS = {"H100": (3.35e12, 1979e12), "H200": (4.8e12, 1979e12)}  # DRAM bytes/s, dense int8 tensor ops/s (SXM)


def limit_fraction(device: str, w_bytes: int, m: int, k: int, n: int, seconds: float) -> float | None:
    """A launch's fraction of the chip's nearer limit: its weights' bytes against DRAM's rate or its int8 products
    (2 m k n) against the tensor cores' rate, whichever it is closer to (None on a chip not in CHIPS)."""
    chip = next((v for name, v in CHIPS.items() if name in device), None)
    if chip is None:
        return None
    return round(max(w_bytes / seconds / chip[0], 2 * m * k * n / seconds / chip[1]), 3)


def repack_q6k(raw: np.ndarray) -> np.ndarray:
    """Q6_K rows (m, blocks * 210) uint8 -> (m, blocks * 212): each block followed by two zero bytes, so that every
    field of every block is 4-byte aligned (sbq.cu's Q6_KP kernels)."""
    m = raw.shape[0]
    blocks = raw.reshape(m, -1, 210)
    return np.concatenate([blocks, np.zeros((m, blocks.shape[1], 2), dtype=np.uint8)], axis=-1).reshape(m, -1)


def q8k(x: np.ndarray) -> np.ndarray:
    """x (n, k) fp16 -> (n, k / 256, 288) uint8, sbq.cu's Q8K: q = rint(x / d) (256 int8), each unit of 32's sum of
    q as its low 7 bits (8 int8) and the rest (8 int8: sum >> 7), d = max |x| / 127 (float32), 12 bytes of padding."""
    n, k = x.shape
    v = x.astype(np.float32).reshape(n, k // 256, 256)
    d = (np.abs(v).max(axis=-1) / np.float32(127)).astype(np.float32)
    safe = np.where(d > 0, d, np.float32(1))[..., None]
    q = np.where(d[..., None] > 0, np.rint(v / safe), 0).astype(np.int8)
    out = np.zeros((n, k // 256, Q8K_BYTES), dtype=np.uint8)
    out[..., :256] = q.view(np.uint8)
    sums = q.reshape(n, k // 256, 8, 32).astype(np.int32).sum(-1)
    out[..., 256:264] = (sums & 127).astype(np.int8).view(np.uint8)
    out[..., 264:272] = (sums >> 7).astype(np.int8).view(np.uint8)
    out[..., 272:276] = d[..., None].view(np.uint8)
    return out

def today(kernels, kind, data, m, k, xq8, y, n) -> None:
    """The launcher GpuKernels.matvec picks for n rows of x in 8 bits (xq8), without its Python around it: the dp4a
    matvec below MMQ_FROM rows, mmq.cu from there."""
    if n >= kernels.mmq_from:
        kernels.mmq(kind, data, m, k, xq8, y, m, n)
    else:
        kernels.matvec_dp4a(kind, data, m, k, xq8, y, m, n)


def arguments(doc: str, argv=None) -> argparse.Namespace:
    """The check's flags: --json FILE (its report), --quick (the bit checks only)."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json")
    p.add_argument("--quick", action="store_true", help="the bit checks only")
    return p.parse_args(argv)


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

    NAMES = ("quantize_q8k", "sbq_sum_parts", "sbq_sum_parts_f32",
             *(f"sbq_{kind}_{v}{suffix}" for kind in ("Q4_K", "Q6_K", "Q6_KP") for v in ("n1", "t1", "t2", "t4", "t8")
               for suffix in ("", "_f32")))

    def __init__(self, cp, warps: int = 4, fn: dict | None = None, defines: tuple[str, ...] = ()):
        """fn: the kernels by name where given (the host's, tests/engine/kernels/test_sbq_host.py), else built (with
        -D `defines`)."""
        from engine.kernels import OPTIONS, kernel_source
        self.cp, self.warps = cp, warps
        if fn is None:
            module = cp.RawModule(code=kernel_source("sbq.cu"), options=(*OPTIONS, *(f"-D{d}" for d in defines)))
            fn = {name: module.get_function(name) for name in self.NAMES}
        self.fn = fn
        self.parts_buffer = None

    def quantize(self, x):
        n, k = x.shape
        out = self.cp.zeros((n, k // 256, Q8K_BYTES), dtype=self.cp.uint8)
        blocks = n * k // 256
        self.fn["quantize_q8k"](((blocks * 32 + 127) // 128,), (128,), (x, out, np.int32(blocks)))
        return out

    def solo(self, kind, data, m, k, xq, y, parts: int = 1):
        """parts: k's segments (a chain each, added in order; the tile kernels' with as many)."""
        suffix = "_f32" if y.dtype == np.float32 else ""
        self.fn[f"sbq_{kind}_n1{suffix}"](((m + self.warps - 1) // self.warps,), (32 * self.warps,),
                                          (data, xq, y, np.int32(m), np.int32(k), np.int32(sbq_segments(k, parts)[0])))

    def tiles(self, kind, data, m, k, xq, y, n, cols: int | None = None, parts: int = 1):
        """cols: x's rows a warp takes (8, 16, 32 or 64; the grid's y splits the n rows among warps), else all n in
        one warp's n-tiles (up to 64); parts: k's segments (the grid's z), their chains added by sbq_sum_parts."""
        rows, suffix = 16 * self.warps, "_f32" if y.dtype == np.float32 else ""
        nt = tiles(n, (1, 2, 4, 8)) if cols is None else cols // 8
        seg, z = sbq_segments(k, parts)
        part = None
        if z > 1:
            if self.parts_buffer is None or self.parts_buffer.size < z * n * m:
                self.parts_buffer = self.cp.empty(z * n * m, dtype=self.cp.float32)
            part = self.parts_buffer
        self.fn[f"sbq_{kind}_t{nt}{suffix}"](((m + rows - 1) // rows, -(-n // (8 * nt)), z), (32 * self.warps,),
                                             (data, xq, y, np.int32(m), np.int32(k), np.int32(m), np.int32(n),
                                              np.int32(seg), part))
        if z > 1:
            self.fn[f"sbq_sum_parts{suffix}"](((n * m + 255) // 256,), (256,),
                                              (part, y, np.int32(m), np.int32(n), np.int32(m), np.int32(z)))


def main(argv=None, cp=None, kernels=None, sbq_fn: dict | None = None, timer=None, sbq_build=None) -> int:
    """On the GPU by default; a dry run on the host passes its stand-ins: cp (HostCupy), kernels (a host GpuKernels),
    sbq_fn (sbq.cu's host kernels), sbq_build (defines -> such kernels built with them) and timer (timed's
    signature)."""
    a = arguments(__doc__, argv)
    if cp is None:
        import cupy as cp
    from gguf import GGMLQuantizationType as Q
    from gguf.quants import dequantize

    from engine.core.quantized import QuantMatrix, QuantPart, row_bytes
    from engine.kernels import GpuKernels
    from tools.device.mmv_check import timed
    from tools.fixtures.make_synthetic_gguf import random_blocks

    timed = timer or timed
    kernels = kernels or GpuKernels(cp)
    sbq = Sbq(cp, fn=sbq_fn)
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
            if n > 8:  # x's rows split among warps, 8 and 16 a warp
                for split in (8, 16):
                    y = cp.full((n, rows), np.nan, dtype=cp.float32)
                    sbq.tiles(kind, data, rows, cols, xq, y, n, cols=split)
                    same[f"{n} split {split}"] = bool(np.array_equal(y.get(), alone[:n]))
        for parts in (2, 3):  # k in segments: each row of x the solo kernel's bits with the same segments
            seg_alone = cp.full((max(ROWS), rows), np.nan, dtype=cp.float32)
            for b in range(max(ROWS)):
                sbq.solo(kind, data, rows, cols, xq[b], seg_alone[b], parts=parts)
            seg_alone = seg_alone.get()
            for n in (1, 9, max(ROWS)):
                y = cp.full((n, rows), np.nan, dtype=cp.float32)
                sbq.tiles(kind, data, rows, cols, xq, y, n, cols=8 if n > 8 else None, parts=parts)
                same[f"{n} in {parts} parts"] = bool(np.array_equal(y.get(), seg_alone[:n]))
        if kind == "Q6_K":  # repacked into 212-byte blocks: the same bits
            padded = cp.asarray(repack_q6k(raw))
            y = cp.full((max(ROWS), rows), np.nan, dtype=cp.float32)
            for b in range(max(ROWS)):
                sbq.solo("Q6_KP", padded, rows, cols, xq[b], y[b])
            same["padded alone"] = bool(np.array_equal(y.get(), alone))
            for n in (9, max(ROWS)):
                y = cp.full((n, rows), np.nan, dtype=cp.float32)
                sbq.tiles("Q6_KP", padded, rows, cols, xq, y, n, parts=3)  # (seg_alone: 3 parts)
                same[f"padded {n} in 3 parts"] = bool(np.array_equal(y.get(), seg_alone[:n]))
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
    def split_times(kind, data, m, k, xk, y32, n) -> dict:
        """k's segments -> {us, cols}: the time at the best split of x's rows among warps (cols a warp)."""
        out = {}
        for parts in (p for p in PARTS if p <= k // 256):
            if n == 1:
                out[parts] = {"us": round(timed(cp, lambda: sbq.solo(kind, data, m, k, xk[0], y32[0], parts=parts))
                                          * 1e3, 1), "cols": 1}
                continue
            runs = {cols: timed(cp, lambda: sbq.tiles(kind, data, m, k, xk, y32, n, cols=cols, parts=parts))
                    for cols in [c for c in (16, 32, 64) if c < 2 * n] + [8]}
            cols = min(runs, key=runs.get)
            out[parts] = {"us": round(runs[cols] * 1e3, 1), "cols": cols}
        return out

    device = cp.cuda.runtime.getDeviceProperties(0)["name"].decode()
    for name, (kind, m, k, data, xq8, xk) in mats.items():
        w_bytes = m * row_bytes(kind, k)
        padded = cp.asarray(repack_q6k(data.get())) if kind == "Q6_K" else None  # 212-byte blocks
        row = {}
        for n in TIMED_ROWS:
            y, y32 = cp.empty((n, m), dtype=cp.float16), cp.empty((n, m), dtype=cp.float32)
            if n == 1:
                sbq_ms = timed(cp, lambda: sbq.solo(kind, data, m, k, xk[0], y32[0]))
            else:
                sbq_ms = timed(cp, lambda: sbq.tiles(kind, data, m, k, xk, y32, n))
            today_ms = timed(cp, lambda: today(kernels, kind, data, m, k, xq8, y, n))
            row[n] = {"sbq_us": round(sbq_ms * 1e3, 1), "today_us": round(today_ms * 1e3, 1),
                      "sbq_TBps": round(w_bytes / sbq_ms / 1e9, 2), "today_TBps": round(w_bytes / today_ms / 1e9, 2),
                      "parts": split_times(kind, data, m, k, xk, y32, n)}
            if padded is not None:
                row[n]["padded_parts"] = split_times("Q6_KP", padded, m, k, xk, y32, n)
            best = min(row[n]["parts"].values(), key=lambda p: p["us"])["us"] / 1e6
            row[n]["limit_fraction"] = {"sbq_best": limit_fraction(device, w_bytes, m, k, n, best),
                                        "today": limit_fraction(device, w_bytes, m, k, n, today_ms / 1e3)}
        times[name] = row
        print(kind, name, json.dumps(row), flush=True)
    # a matrix takes one order at every row count (its rows alone and in a batch the same): its k segments are those
    # fastest at the most rows timed (x's rows split among warps as fits each count: no bit changes), and the mixed
    # forward gives each matrix the route that wins there, sbq's (so split) or today's
    last = TIMED_ROWS[-1]
    parts = {nm: min(times[nm][last]["parts"], key=lambda p, nm=nm: times[nm][last]["parts"][p]["us"]) for nm in SHAPES}
    us = {nm: {n: {"sbq": times[nm][n]["sbq_us"], "split": times[nm][n]["parts"][parts[nm]]["us"],
                   "padded": times[nm][n].get("padded_parts", times[nm][n]["parts"])[parts[nm]]["us"],
                   "today": times[nm][n]["today_us"]} for n in TIMED_ROWS} for nm in SHAPES}
    route = {nm: "split" if us[nm][last]["split"] < us[nm][last]["today"] else "today" for nm in SHAPES}
    forward = {"parts": parts, "mixed_routes": route}
    for n in TIMED_ROWS:
        def total(pick) -> float:  # ms: 32 layers and the head
            return round((32 * sum(us[nm][n][pick(nm)] for nm in ("wqkv", "wo", "w_gate_up", "w_down"))
                          + us["head"][n][pick("head")]) / 1e3, 2)
        forward[n] = {"sbq_ms": total(lambda nm: "sbq"), "sbq_split_ms": total(lambda nm: "split"),
                      "sbq_split_q6k_padded_ms": total(lambda nm: "padded"),
                      "mixed_ms": total(lambda nm: route[nm]), "today_ms": total(lambda nm: "today")}
    print("a forward's matmuls (32 layers + head), ms:", json.dumps(forward), flush=True)
    kind, m, k, data, _, xk = mats["w_gate_up"]
    for warps in (2, 8):
        kq, row = Sbq(cp, warps, sbq_fn), {}
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
    default = {}  # each shape's row by the default build, which every lane count's must equal
    for name, (kind, m, k, data, _, xk) in mats.items():
        default[name] = cp.empty((1, m), dtype=cp.float32)
        sbq.solo(kind, data, m, k, xk[0], default[name][0])
    for lanes in SOLO_LANES:  # the solo kernel's lanes a super-block (SBQ_SOLO_LANES; the default's times above)
        define = (f"SBQ_SOLO_LANES={lanes}",)
        kq, row = Sbq(cp, fn=sbq_build(define) if sbq_build else None, defines=define), {}
        for name, (kind, m, k, data, _, xk) in mats.items():
            y = cp.empty((1, m), dtype=cp.float32)
            kq.solo(kind, data, m, k, xk[0], y[0])
            row[name] = {"us": round(timed(cp, lambda: kq.solo(kind, data, m, k, xk[0], y[0])) * 1e3, 1),
                         "default_us": times[name][1]["sbq_us"],
                         "equal_default": bool(cp.array_equal(y, default[name]))}
            ok &= row[name]["equal_default"]
        knobs[f"solo {lanes} lanes a super-block"] = row
        print("solo kernel,", lanes, "lanes a super-block:", json.dumps(row), flush=True)

    return report(cp, a.json, kernels, ok, checks=checks, times=times, forward=forward, knobs=knobs)


if __name__ == "__main__":
    sys.exit(main())
