"""Whether a prompt chunk's matrix product on the GPU gives each row the same bits whatever the step's
shape (issue 44): the number of rows M and the row's place among them. On the Llama-3-8B shapes (wqkv,
wo, w_gate_up, w_down), random fp16 data (weights ~0.02, activations ~1):

1. cuBLAS as the engine calls it today (HalfCupyOps.matmul: `x @ w.T` through CuPy, fp16 in and out,
   fp32 accumulation). Every row of x[:M] @ w.T against the same row inside M = 4096, for M = 1..64,
   65..512 by 7, 513..4096 by 61 and the powers of two; x[o:o+M] (o = 1, 17, 100) against the same
   rows of M = 4096 and against x[:M]'s rows (the same M, the row elsewhere in the block); the M grouped
   by the bits of their row 0 (which kernel's numerics they got). In this process (the environment as
   given), then in child processes with CUBLAS_WORKSPACE_CONFIG=:0:0 (set before CuPy makes its cuBLAS
   handle), with the pedantic compute type (CUBLAS_COMPUTE_32F_PEDANTIC: CuPy's set_compute_type), and
   with both.
2. Fixed slices of T = 64, 128, 256, 512 rows: X in slices against X shifted by T/2 and by 37 rows
   (other rows before it, the last slice zero-padded), the same rows compared, and a prefix ending
   mid-slice (its last slice zero-padded); the batched forms at B = 1, 2, 7, 16 slices against the
   slices one by one and against the same form's rows at 16 slices: cupy.matmul of (B, T, K) against
   w.T broadcast (cublasGemmBatchedEx, CuPy's path for a broadcast operand) and
   cublasGemmStridedBatchedEx called directly with the weight's batch stride 0. Then the time per
   4096 rows, each shape and the four summed: one GEMM of 4096 rows, the loop of 4096/T slices, the
   two batched forms (in this process, and in the children of TIMED_MODES).
3. mmq.cu (int8 tensor cores) at prompt sizes: Q4_K weights (Q6_K for w_down), random blocks, 64 to
   4096 rows of x (--mmq-rows: others, decode sizes among them): the engine's quantized matvec (GpuKernels.matvec: quantize_q8, then mmq from
   MMQ_FROM rows) and mmq alone, against the engine's prompt path (kernels.expand to fp16, then
   x @ w.T), as tokens/s and TFLOP/s (2 N K n flops); mmq's rows at 2048 rows against the dp4a
   matvec's row alone (bit for bit) and against the same rows at 64 rows.

    python tools/device/prompt_gemm_probe.py [--json FILE] [--quick] [--modes ws0,pedantic,ws0_pedantic]
                                             [--no-mmq] [--no-times]

Times: CUDA events around back-to-back calls (tools/device/mmv_check.py timed), the median of 5
repeats after a warm-up. Exit status 0 when it ran to the end (the findings are data, not checks),
except that mmq's rows must equal the dp4a matvec's.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tools.device.mmv_check import timed  # noqa: E402

SHAPES = {"wqkv": (6144, 4096), "wo": (4096, 4096), "w_gate_up": (28672, 4096), "w_down": (4096, 14336)}
KINDS = {"wqkv": "Q4_K", "wo": "Q4_K", "w_gate_up": "Q4_K", "w_down": "Q6_K"}  # part 3's weights
OFFSETS = (1, 17, 100)
SLICES = (64, 128, 256, 512)
BATCHES = (1, 2, 7, 16)
MMQ_ROWS = (64, 256, 1024, 2048, 4096)
DP4A_ROWS = (0, 1, 777, 2047)  # rows of the 2048-row mmq launch compared with the dp4a matvec alone
MODES = {"ws0": {"CUBLAS_WORKSPACE_CONFIG": ":0:0"}, "pedantic": {},
         "ws0_pedantic": {"CUBLAS_WORKSPACE_CONFIG": ":0:0"}}
TIMED_MODES = ("ws0", "ws0_pedantic")  # child modes whose part 2 is timed too
SHIFT = 37  # an odd shift of the rows, beside T/2


def m_values(rows: int, quick: bool) -> list[int]:
    """The M of part 1: every M to 64, then by 7 to 512, then by 61 to `rows`, and the powers of two."""
    if quick:
        ms = set(range(1, 17)) | {33, 64, 65, 100, 511, 1000, 2047}
    else:
        ms = set(range(1, 65)) | set(range(65, 513, 7)) | set(range(513, rows + 1, 61))
    ms |= {1 << i for i in range(20) if 1 << i <= rows}
    return sorted(m for m in ms if m <= rows)


def dump(obj) -> str:
    """JSON, indented, with each list of numbers on one line."""
    return re.sub(r"\[\s+([-\d.eE,\snul]+?)\s+\]", lambda m: "[" + " ".join(m.group(1).split()) + "]",
                  json.dumps(obj, indent=1)) + "\n"


def spans(ms, flags) -> str:
    """The tested M where flag holds, as runs of consecutive tested values: "1..64, 100"."""
    out, start, prev = [], None, None
    for m, flag in zip(ms, flags):
        if flag and start is None:
            start = m
        elif not flag and start is not None:
            out.append((start, prev))
            start = None
        prev = m
    if start is not None:
        out.append((start, prev))
    return ", ".join(str(a) if a == b else f"{a}..{b}" for a, b in out) or "none"


def bench(cp, fn, target_ms: float = 25.0) -> float:
    """ms per fn(): timed() with as many back-to-back calls a repeat as fill about target_ms."""
    fn()
    cp.cuda.Device().synchronize()
    t0 = time.perf_counter()
    fn()
    cp.cuda.Device().synchronize()
    once = (time.perf_counter() - t0) * 1e3
    return timed(cp, fn, repeats=5, launches=max(1, min(20, int(target_ms / max(once, 1e-3)))))


def bits_differ(cp, a, b):
    """(rows,) bool: where a row of a and the same row of b differ in any bit (fp16)."""
    return (a.view(cp.uint16) != b.view(cp.uint16)).any(axis=1)


def rows_differ(cp, a, b) -> int:
    return int(cp.count_nonzero(bits_differ(cp, a, b)))


def fingerprint(cp, row) -> str:
    return hashlib.sha1(cp.asnumpy(row).tobytes()).hexdigest()[:12]


def take_rows(cp, a, n: int):
    """a's first n rows, a repeated when it has fewer."""
    if n <= a.shape[0]:
        return a[:n]
    return cp.concatenate([a] * -(-n // a.shape[0]))[:n]


def padded(cp, x, t: int):
    """x with zero rows after it to a multiple of t rows."""
    rows = -(-x.shape[0] // t) * t
    if rows == x.shape[0]:
        return x
    out = cp.zeros((rows, x.shape[1]), dtype=x.dtype)
    out[: x.shape[0]] = x
    return out


def in_slices(cp, x, w, t: int, y=None):
    """x @ w.T as x.shape[0] / t products of exactly t rows (the rows a multiple of t)."""
    n = x.shape[0]
    y = cp.empty((n, w.shape[0]), dtype=cp.float16) if y is None else y
    wt = w.T
    for i in range(0, n, t):
        cp.matmul(x[i : i + t], wt, out=y[i : i + t])
    return y


def strided_gemm(cp, pedantic: bool):
    """(xb (B, T, K), w (N, K)[, out]) -> (B, T, N) by one cublasGemmStridedBatchedEx, the weight's batch
    stride 0 (no copy of it), fp32 accumulation (pedantic: CUBLAS_COMPUTE_32F_PEDANTIC); None where CuPy
    has no such binding."""
    try:
        from cupy_backends.cuda.libs import cublas
    except ImportError:
        return None
    compute = getattr(cublas, "CUBLAS_COMPUTE_32F_PEDANTIC", 69) if pedantic else getattr(cublas, "CUBLAS_COMPUTE_32F",
                                                                                          68)
    half = cp.cuda.runtime.CUDA_R_16F
    one, zero = np.ones(1, np.float32), np.zeros(1, np.float32)

    def run(xb, w, out=None):
        b, t, k = xb.shape
        n = w.shape[0]
        y = cp.empty((b, t, n), dtype=cp.float16) if out is None else out
        # column-major: C (n, t) = W (k, n)^T . X_b (k, t); W's stride between batches 0
        cublas.gemmStridedBatchedEx(cp.cuda.device.get_cublas_handle(), cublas.CUBLAS_OP_T, cublas.CUBLAS_OP_N,
                                    n, t, k, one.ctypes.data, w.data.ptr, half, k, 0, xb.data.ptr, half, k, t * k,
                                    zero.ctypes.data, y.data.ptr, half, n, t * n, b, compute,
                                    getattr(cublas, "CUBLAS_GEMM_DEFAULT", -1))
        return y
    return run


def shape_data(cp, index: int, n: int, k: int, rows: int):
    """The same x (rows, k), w (n, k) and other rows (512, k) in every process (a seeded CuPy generator)."""
    rs = cp.random.RandomState(1000 + index)
    x = rs.standard_normal((rows, k), dtype=cp.float32).astype(cp.float16)
    w = (rs.standard_normal((n, k), dtype=cp.float32) * 0.02).astype(cp.float16)
    other = rs.standard_normal((512, k), dtype=cp.float32).astype(cp.float16)
    return x, w, other


# ---------------------------------------------------------------- parts 1 and 2: the bits

def row_invariance(cp, x, w, ms, offsets) -> tuple[dict, object]:
    """Part 1 on one shape: each M's rows against M = rows; x[o:o+M] against the reference and x[:M].
    -> (the findings, the reference product)"""
    rows = x.shape[0]
    ref = x @ w.T
    classes = {fingerprint(cp, ref[0]): 0}  # the bits of row 0 -> a class (0: the reference's)
    out = {"m": ms, "rows_differ": [], "class": [], "worst": None,
           "offsets": {o: {"m": [], "vs_ref": [], "same_m": []} for o in offsets}}
    for m in ms:
        y = x[:m] @ w.T
        differ = rows_differ(cp, y, ref[:m])
        out["rows_differ"].append(differ)
        out["class"].append(classes.setdefault(fingerprint(cp, y[0]), len(classes)))
        if differ:
            diff = cp.abs(y.astype(cp.float32) - ref[:m].astype(cp.float32))
            worst = {"m": m, "max_abs_diff": float(diff.max()),
                     "elements_differ_frac": float(cp.count_nonzero(y.view(cp.uint16) != ref[:m].view(cp.uint16))
                                                   / y.size)}
            if out["worst"] is None or worst["max_abs_diff"] > out["worst"]["max_abs_diff"]:
                out["worst"] = worst
        for o in offsets:
            if o + m > rows:
                continue
            yo = x[o : o + m] @ w.T
            row = out["offsets"][o]
            row["m"].append(m)
            row["vs_ref"].append(rows_differ(cp, yo, ref[o : o + m]))
            row["same_m"].append(rows_differ(cp, yo[: m - o], y[o:]) if m > o else None)
    out["classes"] = {c: spans(ms, [k == c for k in out["class"]]) for c in range(len(classes))}
    return out, ref


def slice_invariance(cp, x, w, other, ref, tees, batches, strided) -> dict:
    """Part 2's bits on one shape: slices of t rows against shifted slices, a padded tail, the batched forms."""
    rows, (n, k) = x.shape[0], w.shape
    wtc = cp.ascontiguousarray(w.T)  # (k, n): cupy.matmul's broadcast path copies a strided operand each call
    out = {}
    for t in tees:
        ys = in_slices(cp, x, w, t)
        r = {"vs_one_gemm": rows_differ(cp, ys, ref)}
        for s in (t // 2, SHIFT):  # the same rows at another place in their slices (and other slices)
            xs = padded(cp, cp.concatenate([take_rows(cp, other, s), x]), t)
            r[f"shift_{s}"] = rows_differ(cp, in_slices(cp, xs, w, t)[s : s + rows], ys)
        tail = rows - SHIFT  # a prefix ending mid-slice, its last slice zero-padded
        r["tail_padded"] = rows_differ(cp, in_slices(cp, padded(cp, x[:tail], t), w, t)[:tail], ys[:tail])
        most = {}  # each batched form at the most slices: the rows every smaller batch count must give
        for b in sorted(batches, reverse=True):
            xb = cp.ascontiguousarray(take_rows(cp, x, b * t)).reshape(b, t, k)
            want = take_rows(cp, ys, b * t)
            forms = {"batched": cp.matmul(xb, wtc).reshape(b * t, n)}
            if strided is not None:
                forms["strided"] = strided(xb, w).reshape(b * t, n)
            for form, got in forms.items():
                r[f"{form}_{b}"] = rows_differ(cp, got, want)  # against the slices one by one
                most.setdefault(form, (b, got))
                if b != most[form][0]:  # against the same form at the most slices
                    r[f"{form}_{b}_vs_{most[form][0]}"] = rows_differ(cp, got, most[form][1][: b * t])
        out[t] = r
    return out


def invariance(cp, mode: str, a) -> dict:
    """Parts 1 and 2's bits on every shape, in this process's mode; one GEMM's time of `rows` rows beside."""
    if "pedantic" in mode:
        try:
            from cupy._core import _routines_linalg as linalg
            linalg.set_compute_type(np.float16, getattr(linalg, "COMPUTE_TYPE_PEDANTIC", 2))
        except (ImportError, AttributeError, ValueError) as e:
            return {"error": f"no pedantic compute type in this CuPy: {type(e).__name__}: {e}"}
    strided = strided_gemm(cp, "pedantic" in mode)
    ms = m_values(a.rows, a.quick)
    offsets = OFFSETS[:2] if a.quick else OFFSETS
    tees = tuple(t for t in ((64, 256) if a.quick else SLICES) if a.rows % t == 0)
    batches = (1, 7) if a.quick else BATCHES
    result = {"env_CUBLAS_WORKSPACE_CONFIG": os.environ.get("CUBLAS_WORKSPACE_CONFIG"), "shapes": {}}
    try:
        from cupy._core import _routines_linalg as linalg
        result["compute_type_f16"] = linalg.compute_type_to_str(linalg.get_compute_type(np.float16))
    except (ImportError, AttributeError):
        pass
    for index, (name, (n, k)) in enumerate(a.shapes.items()):
        t0 = time.perf_counter()
        x, w, other = shape_data(cp, index, n, k, a.rows)
        rows, ref = row_invariance(cp, x, w, ms, offsets)
        shape = {"n": n, "k": k, "rows": rows,
                 "ref_fingerprint": hashlib.sha1(cp.asnumpy(ref[:64]).tobytes()
                                                 + cp.asnumpy(ref[-64:]).tobytes()).hexdigest()[:16],
                 "slices": slice_invariance(cp, x, w, other, ref, tees, batches, strided)}
        y = cp.empty((a.rows, n), dtype=cp.float16)
        wt = w.T
        shape["one_gemm_ms"] = bench(cp, lambda: cp.matmul(x, wt, out=y))
        shape["seconds"] = round(time.perf_counter() - t0, 1)
        result["shapes"][name] = shape
        print_invariance(mode, name, shape, a.rows)
    return result


def print_invariance(mode: str, name: str, s: dict, rows: int) -> None:
    r = s["rows"]
    ms, differ = r["m"], r["rows_differ"]
    print(f"[{mode}] {name} {s['n']}x{s['k']}: rows equal to M={rows}'s at M {spans(ms, [d == 0 for d in differ])}; "
          f"differ at M {spans(ms, [d > 0 for d in differ])}"
          + (f" (worst {r['worst']})" if r["worst"] else ""), flush=True)
    print("    row-0 classes: " + "; ".join(f"c{c}{' (ref)' if c == 0 else ''}: {sp}" for c, sp in
                                              r["classes"].items()), flush=True)
    for o, row in r["offsets"].items():
        same = [(m, d) for m, d in zip(row["m"], row["same_m"]) if d is not None]
        print(f"    offset {o}: vs ref differ at M {spans(row['m'], [d > 0 for d in row['vs_ref']])}; "
              f"same M, other place: differ at M {spans([m for m, _ in same], [d > 0 for _, d in same])}",
              flush=True)
    for t, sl in s["slices"].items():
        print(f"    slices of {t}: " + ", ".join(f"{key}={v}" for key, v in sl.items()) + " (rows differing)",
              flush=True)
    print(f"    one GEMM of {rows} rows: {s['one_gemm_ms']:.3f} ms ({s['seconds']} s for this shape)", flush=True)


def child_modes(a, path: Path, deadline: float) -> dict:
    """Part 1 and 2's bits again in a child process per mode (its environment set before CuPy starts)."""
    out = {}
    for mode in a.modes:
        left = deadline - time.monotonic()
        if left < 20:
            out[mode] = {"error": "skipped: no time left"}
            continue
        env = dict(os.environ, **MODES[mode])
        child = path / f"{mode}.json"
        cmd = [sys.executable, __file__, "--child", mode, "--json", str(child), "--rows", str(a.rows),
               "--shapes", ";".join(f"{k}={n},{c}" for k, (n, c) in a.shapes.items())] + (["--quick"] if a.quick else []) \
            + (["--no-times"] if a.no_times else [])
        try:
            rc = subprocess.run(cmd, env=env, timeout=left).returncode
            out[mode] = json.loads(child.read_text()) if child.exists() else {"error": f"child exited {rc}, no result"}
        except subprocess.TimeoutExpired:
            out[mode] = {"error": "child timed out"}
    return out


# ---------------------------------------------------------------- part 2's times

def slice_times(cp, a, mode: str = "default") -> dict:
    """ms per `rows` rows of each shape: one GEMM, slices of T in a loop, the two batched forms; their sums."""
    strided = strided_gemm(cp, "pedantic" in mode)
    tees = tuple(t for t in ((64, 256) if a.quick else SLICES) if a.rows % t == 0)
    out = {}
    for index, (name, (n, k)) in enumerate(a.shapes.items()):
        x, w, _ = shape_data(cp, index, n, k, a.rows)
        wt, wtc = w.T, cp.ascontiguousarray(w.T)
        y = cp.empty((a.rows, n), dtype=cp.float16)
        row = {"one_gemm": bench(cp, lambda: cp.matmul(x, wt, out=y))}
        for t in tees:
            xb, yb = x.reshape(a.rows // t, t, k), y.reshape(a.rows // t, t, n)
            row[f"slices_{t}"] = bench(cp, lambda: in_slices(cp, x, w, t, y))
            row[f"batched_{t}"] = bench(cp, lambda: cp.matmul(xb, wtc, out=yb))
            if strided is not None:
                row[f"strided_{t}"] = bench(cp, lambda: strided(xb, w, yb))
        out[name] = {key: round(v, 4) for key, v in row.items()}
        print(f"[{mode}] times {name} (ms per {a.rows} rows): {json.dumps(out[name])}", flush=True)
    flops = sum(2 * n * k * a.rows for n, k in a.shapes.values())
    total = {key: round(sum(out[s][key] for s in out), 3) for key in next(iter(out.values()))}
    out["sum"] = total
    out["sum_TFLOPs"] = {key: round(flops / (ms * 1e-3) / 1e12, 1) for key, ms in total.items()}
    print(f"[{mode}] times, the shapes summed (ms per {a.rows} rows): {json.dumps(total)}", flush=True)
    print(f"    TFLOP/s: {json.dumps(out['sum_TFLOPs'])}", flush=True)
    return out


# ---------------------------------------------------------------- part 3: mmq at prompt sizes

def mmq_part(cp, kernels, a) -> dict:
    """mmq (the engine's quantized matvec from MMQ_FROM rows) against expand + cuBLAS at prompt sizes."""
    from gguf import GGMLQuantizationType as Q

    from engine.core.quantized import UNIT, QuantMatrix, QuantPart
    from tools.fixtures.make_synthetic_gguf import random_blocks

    rng = np.random.default_rng(44)
    counts = tuple(r for r in (a.mmq_rows or ((64, 2048) if a.quick else MMQ_ROWS)) if r <= a.rows)
    kernels.reserve_scratch(max(n * k for n, k in a.shapes.values()))
    out, ok = {"shapes": {}, "mmq_from": kernels.mmq_from}, True
    for index, (name, (n, k)) in enumerate(a.shapes.items()):
        kind = KINDS.get(name, "Q4_K")
        data = cp.asarray(random_blocks(rng, Q[kind], n, k, 0.02))
        matrix = QuantMatrix((QuantPart(kind, data, n),), k)
        x = cp.random.RandomState(2000 + index).standard_normal((max(counts), k), dtype=cp.float32).astype(cp.float16)
        shape = {"kind": kind, "n": n, "k": k, "rows": {}}
        first = None
        for rows in counts:
            xr = x[:rows]
            xq = kernels.quantize_q8(xr.reshape(-1))
            y = cp.empty((rows, n), dtype=cp.float16)
            yg = cp.empty((rows, n), dtype=cp.float16)
            t = {"quantize_q8": bench(cp, lambda: kernels.quantize_q8(xr.reshape(-1))),
                 "mmq": bench(cp, lambda: kernels.mmq(kind, data, n, k, xq, y, n, rows)),
                 "engine_matvec": bench(cp, lambda: kernels.matvec(matrix, xr, cp.float16)),
                 "expand": bench(cp, lambda: kernels.expand(matrix))}
            wexp = kernels.expand(matrix)
            t["gemm"] = bench(cp, lambda: cp.matmul(xr, wexp.T, out=yg))
            t["expand_gemm"] = t["expand"] + t["gemm"]
            ym = kernels.matvec(matrix, xr, cp.float16)
            yg = xr @ kernels.expand(matrix).T
            flops = 2 * n * k * rows
            row = {f"{key}_ms": round(v, 4) for key, v in t.items()}
            for key in ("mmq", "engine_matvec", "gemm", "expand_gemm"):
                row[f"{key}_tok_s"] = round(rows / (t[key] * 1e-3))
                row[f"{key}_TFLOPs"] = round(flops / (t[key] * 1e-3) / 1e12, 1)
            row["mmq_vs_gemm_max_rel"] = float(cp.abs(ym.astype(cp.float32) - yg.astype(cp.float32)).max()
                                               / cp.abs(yg.astype(cp.float32)).max())
            if first is None:
                first = ym
            else:  # the first rows as they were in the smallest launch
                row[f"rows_differ_from_{first.shape[0]}_row_launch"] = rows_differ(cp, ym[: first.shape[0]], first)
                ok &= row[f"rows_differ_from_{first.shape[0]}_row_launch"] == 0
            if rows == 2048:  # the property mmq.cu keeps: each row the dp4a matvec's row alone
                units = k // UNIT
                same = {}
                for i in DP4A_ROWS:
                    y1 = cp.empty((1, n), dtype=cp.float16)
                    kernels.matvec_dp4a(kind, data, n, k, xq[i * units :], y1, n, 1)
                    same[i] = bool(cp.array_equal(y1[0].view(cp.uint16), ym[i].view(cp.uint16)))
                row["equal_dp4a_alone"] = same
                ok &= all(same.values())
            shape["rows"][rows] = row
            print(f"mmq {name} {kind} {n}x{k} rows={rows}: " + json.dumps(row), flush=True)
        out["shapes"][name] = shape
    out["sum"] = {}
    for rows in counts:
        ms = {key: sum(out["shapes"][s]["rows"][rows][f"{key}_ms"] for s in out["shapes"])
              for key in ("mmq", "engine_matvec", "expand", "gemm", "expand_gemm")}
        flops = sum(2 * n * k * rows for n, k in a.shapes.values())
        out["sum"][rows] = {**{f"{key}_ms": round(v, 3) for key, v in ms.items()},
                            **{f"{key}_tok_s": round(rows / (v * 1e-3)) for key, v in ms.items() if key != "expand"},
                            **{f"{key}_TFLOPs": round(flops / (v * 1e-3) / 1e12, 1) for key, v in ms.items()
                               if key != "expand"}}
        print(f"mmq vs expand+GEMM, the shapes summed, {rows} rows: {json.dumps(out['sum'][rows])}", flush=True)
    out["ok"] = bool(ok)
    return out


# ---------------------------------------------------------------- main

def parse_shapes(text: str) -> dict[str, tuple[int, int]]:
    shapes = {}
    for item in filter(None, text.split(";")):
        name, dims = item.split("=")
        n, k = dims.split(",")
        shapes[name] = (int(n), int(k))
    return shapes


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json")
    p.add_argument("--quick", action="store_true", help="fewer M, slices, batches and row counts")
    p.add_argument("--modes", default=",".join(MODES), help=f"child processes' modes ({', '.join(MODES)}); '' none")
    p.add_argument("--no-mmq", action="store_true", help="no part 3")
    p.add_argument("--no-times", action="store_true", help="no timing of part 2")
    p.add_argument("--mmq-rows", help="part 3's rows of x, comma-separated (default: 64 to 4,096; decode sizes such "
                   "as 1,2,4,8,16,32,64 put the engine's decode matvec beside cuBLAS on the fp16 weights)")
    p.add_argument("--rows", type=int, default=4096, help="rows of the reference and of the timed products")
    p.add_argument("--shapes", default=";".join(f"{k}={n},{c}" for k, (n, c) in SHAPES.items()),
                   help="name=N,K;... (default: the Llama-3-8B shapes)")
    p.add_argument("--deadline-s", type=float, default=480, help="children and later parts skipped past this")
    p.add_argument("--child", help=argparse.SUPPRESS)  # a mode: parts 1 and 2's bits only, into --json
    a = p.parse_args()
    a.shapes = parse_shapes(a.shapes)
    a.mmq_rows = tuple(int(r) for r in a.mmq_rows.split(",")) if a.mmq_rows else None
    a.modes = [m for m in a.modes.split(",") if m]
    unknown = set(a.modes) - MODES.keys()
    if unknown:
        p.error(f"unknown modes {sorted(unknown)}")
    deadline = time.monotonic() + a.deadline_s
    import cupy as cp

    if a.child:
        result = invariance(cp, a.child, a)
        if a.child in TIMED_MODES and not a.no_times and "error" not in result:
            result["slice_times_ms"] = slice_times(cp, a, a.child)
        Path(a.json).write_text(dump(result))
        return 0

    kernels = None
    if not a.no_mmq:  # built in the background while parts 1 and 2 run
        from engine.kernels import GpuKernels
        from engine.kernels.model_parts import ModelKernels
        kernels = GpuKernels(cp, prompt_attention="mma", model=ModelKernels(frozenset(KINDS.values()), 128, 4))
    result = {"device": device_name(cp), "cupy": cp.__version__, "cublas": cublas_version(cp), "rows": a.rows,
              "shapes": {k: list(v) for k, v in a.shapes.items()}, "modes": {}}

    def save():
        if a.json:
            Path(a.json).write_text(dump(result))

    t0 = time.perf_counter()
    result["modes"]["default"] = invariance(cp, "default", a)
    save()
    with tempfile.TemporaryDirectory() as tmp:
        result["modes"].update(child_modes(a, Path(tmp), deadline - 120))
    save()
    if not a.no_times and time.monotonic() < deadline - 60:
        result["slice_times_ms"] = slice_times(cp, a)
        save()
    ok = True
    if kernels is not None and time.monotonic() < deadline - 30:
        kernels.ready()
        result["mmq"] = mmq_part(cp, kernels, a)
        ok = result["mmq"]["ok"]
    result["seconds"] = round(time.perf_counter() - t0, 1)
    save()
    print(f"done in {result['seconds']} s" + ("" if ok else "; mmq rows NOT equal to the dp4a matvec's"))
    return 0 if ok else 1


def device_name(cp) -> str:
    try:
        return cp.cuda.runtime.getDeviceProperties(0)["name"].decode()
    except (AttributeError, KeyError):
        return "unknown"


def cublas_version(cp):
    try:
        from cupy_backends.cuda.libs import cublas
        return cublas.getVersion(cp.cuda.device.get_cublas_handle())
    except Exception as e:  # reported, not fatal
        return f"unknown ({type(e).__name__})"


if __name__ == "__main__":
    sys.exit(main())
