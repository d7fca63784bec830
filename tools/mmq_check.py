"""The first attempt at the quantized matvec on the int8 tensor cores (engine/kernels/mmq.cu; the
engine does not launch it: it measured slower than the dp4a matvec, bench/README.md says why) on
the GPU: against NumPy
for every kind the engine keeps quantized (odd shapes, 1-70 rows of x), batch invariance (each row
of a batch of n equal, bit for bit, to the same row alone), and its time on the Llama-3-8B decode
shapes at 1, 4, 16 and 64 rows beside the CUDA-core dp4a matvec it replaces (quant.cu matvec_*,
16 rows a launch), with the weight bytes per second each reaches; then the tile knobs
(MMQ_PHASES, MMQ_WIDE_MT) timed, each checked to change no bit of a launch's rows against its own
solo runs.

    python tools/mmq_check.py [--json FILE] [--quick]

Exit status 0 when every check passes.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))

from mmv_check import timed  # noqa: E402

SHAPES = {"wqkv": (6144, 4096), "wo": (4096, 4096), "w_gate_up": (28672, 4096), "w_down": (4096, 14336),
          "head": (128256, 4096)}
ODD = [(37, 512), (131, 768), (5, 14336), (300, 4096), (17, 96)]
ROWS = (1, 2, 3, 8, 9, 17, 33, 64, 70)
TIMED_ROWS = (1, 4, 16, 64)
MMQ_TILE_ROWS = {1: 16, 2: 16, 4: 32, 8: 32}  # mmq.cu's n-tiles of 8 rows of x -> weight rows a block (16 MT)
KNOBS = (("MMQ_PHASES=8 MMQ_WIDE_MT=1", 8, 1), ("MMQ_WIDE_MT=1", 4, 1))


class Mmq:
    """mmq.cu compiled with the given defines, launched as the engine launches its matvecs."""

    def __init__(self, cp, phases: int = 4, wide_mt: int | None = None):
        from engine.kernels import OPTIONS, kernel_source

        defines = (f"-DMMQ_PHASES={phases}",) + ((f"-DMMQ_WIDE_MT={wide_mt}",) if wide_mt else ())
        self.cp, self.phases = cp, phases
        self.module = cp.RawModule(code=kernel_source("mmq.cu"), options=OPTIONS + defines)
        self.tile_rows = dict(MMQ_TILE_ROWS) | ({4: 16 * wide_mt, 8: 16 * wide_mt} if wide_mt else {})

    def __call__(self, kind: str, data, m: int, k: int, xq, n: int, dtype=np.float32, y=None):
        """y (n, m) = x (n, k) @ W^T, x as Q8 units (n * k / 32), 64 rows of x a launch."""
        cp, units = self.cp, k // 32
        y = cp.empty((n, m), dtype=dtype) if y is None else y
        suffix = "_f32" if np.dtype(dtype) == np.float32 else ""
        for b0 in range(0, n, 64):
            nb = min(64, n - b0)
            nt = next(t for t in self.tile_rows if 8 * t >= nb)
            self.module.get_function(f"mmq_{kind}_t{nt}{suffix}")(
                (-(-m // self.tile_rows[nt]),), (32 * self.phases,),
                (data, xq[b0 * units:], y[b0:], np.int32(m), np.int32(k), np.int32(m), np.int32(nb)))
        return y


def rel_err(got, want) -> float:
    return float(np.max(np.abs(got - want)) / max(float(np.max(np.abs(want))), 1e-30))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json")
    p.add_argument("--quick", action="store_true", help="correctness only, no timing")
    a = p.parse_args()
    import cupy as cp
    from gguf import GGMLQuantizationType as Q
    from gguf.quants import dequantize
    from make_synthetic_gguf import random_blocks

    from engine.kernels import MATVEC_THREADS, GpuKernels, matvec_rows
    from engine.quantized import BLOCKS, quantize_q8, row_bytes

    kernels = GpuKernels(cp)
    mmq = Mmq(cp)
    rng = np.random.default_rng(7)
    ok, checks, times, knobs = True, [], {}, {}

    # ---- correctness and batch invariance, every kind
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
            alone = np.stack([mmq(kind, data, rows, cols, xq[b * units:], 1).get()[0] for b in range(max(ROWS))])
            for n in ROWS:
                got = mmq(kind, data, rows, cols, xq, n).get()
                err, same = rel_err(got, want[:n]), bool(np.array_equal(got, alone[:n]))
                half = mmq(kind, data, rows, cols, xq, n, np.float16).get().astype(np.float32)
                half_ok = bool(np.allclose(half, got, rtol=2e-3, atol=2e-3 * float(np.max(np.abs(got)))))
                good = err < 1e-3 and same and half_ok
                ok &= good
                checks.append({"kind": kind, "m": rows, "k": cols, "n": n, "max_rel_err": err,
                               "batch_invariant": same, "fp16_out_ok": half_ok})
                if not good:
                    print("FAIL", json.dumps(checks[-1]), flush=True)
        print(kind, "checked:", sum(c["kind"] == kind for c in checks), "cases", flush=True)
    if a.quick:
        print("ALL PASS" if ok else "FAILED")
        return 0 if ok else 1

    # ---- time per launch on the 8B shapes, beside the dp4a matvec
    for kind in ("Q4_K", "Q6_K", "Q8_0", "Q4_0"):
        for name, (m, k) in SHAPES.items():
            w_bytes = m * row_bytes(kind, k)
            data = cp.asarray(rng.integers(0, 256, (m, row_bytes(kind, k)), dtype=np.uint8) & 0x3F)  # sane scales
            x = cp.asarray((rng.standard_normal((64, k)) * 0.5).astype(np.float16))
            xq = kernels.quantize_q8(x.reshape(-1))
            row = {}
            for n in TIMED_ROWS:
                mmq_ms = timed(cp, lambda: mmq(kind, data, m, k, xq, n, np.float16))
                y = cp.empty((n, m), dtype=cp.float16)

                def dp4a():
                    for b0 in range(0, n, 16):
                        nb = min(16, n - b0)
                        stage = kernels.stage_bytes(kind, data, m, k, nb)
                        kernels.fn[f"matvec_{kind}_n{nb}"]((-(-m // matvec_rows(nb)),), (MATVEC_THREADS,),
                                                            (data, xq[b0 * (k // 32):], y[b0:], np.int32(m), np.int32(k),
                                                             np.int32(m), np.int32(stage)),
                                                            shared_mem=stage * (MATVEC_THREADS // 32))
                dp4a_ms = timed(cp, dp4a)
                row[n] = {"mmq_us": round(mmq_ms * 1e3, 1), "dp4a_us": round(dp4a_ms * 1e3, 1),
                          "mmq_TBps": round(w_bytes / mmq_ms / 1e9, 2), "dp4a_TBps": round(w_bytes / dp4a_ms / 1e9, 2)}
            times[f"{kind} {name} {m}x{k}"] = row
            print(kind, name, json.dumps(row), flush=True)

    # ---- the tile knobs: time and invariance within each build
    m, k = SHAPES["w_gate_up"]
    data = cp.asarray(rng.integers(0, 256, (m, row_bytes("Q4_K", k)), dtype=np.uint8) & 0x3F)
    xq = kernels.quantize_q8(cp.asarray((rng.standard_normal(64 * k) * 0.5).astype(np.float16)))
    units = k // 32
    for label, phases, wide_mt in KNOBS:
        variant = Mmq(cp, phases, wide_mt)

        def launch(n, y, xs=xq):
            variant("Q4_K", data, m, k, xs, n, y=y)
        row = {}
        for n in TIMED_ROWS:
            y = cp.empty((n, m), dtype=cp.float32)
            launch(n, y)
            alone = cp.empty((n, m), dtype=cp.float32)
            for b in range(n):
                launch(1, alone[b:], xq[b * units:])
            same = bool(cp.array_equal(y, alone))
            ok &= same
            row[n] = {"us": round(timed(cp, lambda: launch(n, y)) * 1e3, 1), "equal_alone": same}
        knobs[label] = row
        print("Q4_K w_gate_up", label, json.dumps(row), flush=True)

    print("ALL PASS" if ok else "FAILED")
    if a.json:
        Path(a.json).write_text(json.dumps({"checks": checks, "times": times, "knobs": knobs, "ok": ok,
                                            "device": cp.cuda.runtime.getDeviceProperties(0)["name"].decode()},
                                           indent=1) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
