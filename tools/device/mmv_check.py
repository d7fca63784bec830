"""The tensor-core fp16 matvec (engine/kernels/mmv.cu) on the GPU: against NumPy, batch invariance
(each row of a batch of n equal, bit for bit, to the same row alone), and its time beside cuBLAS
on the Llama-3-8B decode shapes, for several warps per block and chunks in flight. (The CUDA-core
batched matvec it replaced is timed beside it in bench/results/mmv_check_h200.json, "cuda_core_ms".)

    python tools/device/mmv_check.py [--json FILE]

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

SHAPES = {"wqkv": (6144, 4096), "wo": (4096, 4096), "w_gate_up": (28672, 4096), "w_down": (4096, 14336),
          "head": (128256, 4096), "smollm2 wqkv": (960, 576)}
BATCHES = (1, 2, 3, 4, 5, 8, 9, 12, 16, 17, 24, 33, 48, 64)


def timed(cp, fn, repeats: int = 5, launches: int = 20) -> float:
    """ms per fn() on the GPU: the median over repeats of `launches` back-to-back launches between
    two CUDA events (launches queue faster than they run, so the host's launch cost is hidden, as
    in a decode graph), after a warm-up."""
    fn()
    times = []
    for _ in range(repeats):
        start, end = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        for _ in range(launches):
            fn()
        end.record()
        end.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, end) / launches)
    return float(np.median(times))


VARIANTS = ((4, 4), (4, 8), (8, 4), (8, 8))  # (MMV_WARPS, MMV_UNROLL) timed beside the built-in one
WIDE_G = (1, 2)  # MMV_WIDE_G: weight tiles a block takes at 32 and 64 rows of x


def variant_times(cp, kernels, w, x, m: int, k: int, alone) -> dict[str, float]:
    """ms of mmv.cu compiled with other warps per block and chunks in flight, for 1, 8 and 16 rows;
    then with 1 and 2 weight tiles a block at 32 and 64 rows, each launch's rows checked equal to
    the same rows alone (G must change no bit)."""
    from engine.kernels import OPTIONS, kernel_source

    out = {}
    for warps, unroll in VARIANTS:
        module = cp.RawModule(code=kernel_source("mmv.cu"), options=OPTIONS + (  # one wide tile: 8 warps' smem fits
            f"-DMMV_WARPS={warps}", f"-DMMV_UNROLL={unroll}", "-DMMV_WIDE_G=1"))
        for n in (1, 8, 16):
            fn = module.get_function(f"mmv_f16_t{1 if n <= 8 else 2}")
            y = cp.empty((n, m), dtype=cp.float16)
            out[f"w{warps}u{unroll}n{n}"] = timed(cp, lambda: fn(((m + 15) // 16,), (32 * warps,),
                                                                 (w, x, y, np.int32(m), np.int32(k), np.int32(m),
                                                                  np.int32(n))))
    for g in WIDE_G:
        module = cp.RawModule(code=kernel_source("mmv.cu"), options=OPTIONS + (f"-DMMV_WIDE_G={g}",))
        for n, nt in ((32, 4), (64, 8)):
            fn = module.get_function(f"mmv_f16_t{nt}_f32")
            y = cp.empty((n, m), dtype=cp.float32)
            launch = lambda: fn((-(-m // (16 * g)),), (128,), (w, x, y, np.int32(m), np.int32(k), np.int32(m),  # noqa: E731
                                                               np.int32(n)))
            launch()
            out[f"g{g}n{n}"] = timed(cp, launch)
            out[f"g{g}n{n}_equal_alone"] = bool(np.array_equal(y.get(), alone[:n]))
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json")
    a = p.parse_args()
    import cupy as cp

    from engine.kernels import GpuKernels

    kernels = GpuKernels(cp)
    rng = np.random.default_rng(0)
    report, ok = [], True
    variants = {}
    for name, (m, k) in SHAPES.items():
        w_host = (rng.standard_normal((m, k), dtype=np.float32) * 0.02).astype(np.float16)
        x_host = rng.standard_normal((max(BATCHES), k), dtype=np.float32).astype(np.float16)
        w, x = cp.asarray(w_host), cp.asarray(x_host)
        ref = x_host.astype(np.float64) @ w_host.astype(np.float64).T  # (64, m)
        alone = cp.stack([kernels.matvec(w, x[b : b + 1], np.float32)[0] for b in range(max(BATCHES))]).get()
        variants[name] = variant_times(cp, kernels, w, x, m, k, alone)
        ok &= all(v for key, v in variants[name].items() if key.endswith("_equal_alone"))
        print(name, json.dumps({v: (round(t, 4) if isinstance(t, float) else t) for v, t in variants[name].items()}),
              flush=True)
        for n in BATCHES:
            got = kernels.matvec(w, x[:n], np.float32).get()  # (n, m)
            err = float(np.max(np.abs(got - ref[:n])) / np.max(np.abs(ref[:n])))
            same = bool(np.array_equal(got, alone[:n]))
            half = kernels.matvec(w, x[:n], np.float16).get().astype(np.float32)
            half_ok = bool(np.allclose(half, got, rtol=2e-3, atol=1e-3))
            row = {"shape": name, "m": m, "k": k, "n": n, "max_rel_err": err, "batch_invariant": same,
                   "fp16_out_ok": half_ok}
            row["mmv_ms"] = timed(cp, lambda: kernels.matvec(w, x[:n], np.float16))
            row["mmv_GBps"] = m * k * 2 / row["mmv_ms"] / 1e6
            row["cublas_ms"] = timed(cp, lambda: x[:n] @ w.T)
            if n > 16:  # as launches took up to 16 rows before: the weights read once per 16
                y16 = cp.empty((n, m), dtype=cp.float16)
                fn16 = kernels.fn["mmv_f16_t2"]
                row["launches_of_16_ms"] = timed(cp, lambda: [fn16(((m + 15) // 16,), (128,), (
                    w, x[b0:], y16[b0:], np.int32(m), np.int32(k), np.int32(m), np.int32(min(16, n - b0))))
                    for b0 in range(0, n, 16)])
            ok &= err < 1e-3 and same and half_ok
            report.append(row)
            print(json.dumps({k_: (round(v, 4) if isinstance(v, float) else v) for k_, v in row.items()}), flush=True)
    print("ALL PASS" if ok else "FAILED")
    if a.json:
        Path(a.json).write_text(json.dumps({"rows": report, "variants_ms": variants, "ok": ok, "device": cp.cuda.runtime.getDeviceProperties(0)
                                            ["name"].decode()}, indent=1) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
