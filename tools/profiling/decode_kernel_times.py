"""What each kernel of a decode step costs on the GPU, timed per launch (back-to-back launches
between two events, so host launch costs stay out): the matvec of each weight kind on the
Llama-3-8B shapes against the weights' bytes (TB/s), with quant.cu compiled for each (warps per
block, rows per warp), its rows read directly and staged in shared memory by bulk copies; then the step's other kernels (norm, RoPE, decode attention, SwiGLU).

    python tools/profiling/decode_kernel_times.py [--json OUT]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import cupy as cp  # noqa: E402

from engine.config import MAX_BLOCK as BLOCK  # noqa: E402  (the KV pool's default block size)
from engine.runner.decode_graph import bucket  # noqa: E402
from engine.kernels import MATVEC_STAGE_MAX, OPTIONS, GpuKernels, kernel_source  # noqa: E402
from engine.core.quantized import row_bytes  # noqa: E402

SHAPES = [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336), (128256, 4096)]
KINDS = ("Q4_K", "Q6_K", "Q8_0", "Q4_0")  # fp16 weights: tools/device/mmv_check.py times mmv.cu
LAUNCHES = 50


def time_us(fn) -> float:
    """GPU time per launch: LAUNCHES launches captured as one CUDA graph and replayed, as the
    engine's decode step is (launched from Python one by one, small kernels would time the host)."""
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        fn()  # fills the stream's memory pool, so the capture allocates nothing new
        stream.begin_capture()
        for _ in range(LAUNCHES):
            fn()
        graph = stream.end_capture()
        graph.launch(stream)
        a, b = cp.cuda.Event(), cp.cuda.Event()
        a.record(stream)
        graph.launch(stream)
        b.record(stream)
        b.synchronize()
    return cp.cuda.get_elapsed_time(a, b) * 1000 / LAUNCHES


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--json")
    p.add_argument("--configs", default="4x1", help="matvec builds to time, WARPSxROWS[xPREFETCH] each "
                   "(MV_WARPS, MV_SOLO_ROWS, MV_PREFETCH bytes), comma-separated")
    p.add_argument("--kinds", default=",".join(KINDS))
    a = p.parse_args()
    source = kernel_source("quant.cu")
    out = {}
    kernels = GpuKernels(cp)
    for config in a.configs.split(","):
        warps, rows, *prefetch = (int(v) for v in config.split("x"))
        module = cp.RawModule(code=source, options=OPTIONS + (f"-DMV_WARPS={warps}", f"-DMV_SOLO_ROWS={rows}",
                                                                *(f"-DMV_PREFETCH={v}" for v in prefetch)))
        for kind in a.kinds.split(","):
            fn = module.get_function(f"matvec_{kind}_n1")
            fn.max_dynamic_shared_size_bytes = MATVEC_STAGE_MAX
            for m, k in SHAPES:
                w = cp.random.randint(0, 255, (m, row_bytes(kind, k)), dtype=cp.uint8)
                w[:] = w & 0x3F  # sane scales: random fp16 bits may be NaN (same speed, but keep it clean)
                x = cp.asarray((np.random.default_rng(0).standard_normal(k) * 0.1).astype(np.float16))
                x = kernels.quantize_q8(x)  # the quantized kinds read x in 8 bits (quantize_q8, timed below)
                y = cp.empty(m, dtype=cp.float16)
                per_block = warps * rows
                staged = rows * row_bytes(kind, k)  # a warp's rows by one bulk copy (stage.cuh), or read directly
                for stage in (0, staged) if staged % 16 == 0 and warps * staged <= MATVEC_STAGE_MAX else (0,):
                    us = time_us(lambda: fn(((m + per_block - 1) // per_block,), (warps * 32,),
                                            (w, x, y, np.int32(m), np.int32(k), np.int32(m), np.int32(stage)),
                                            shared_mem=warps * stage))
                    key = f"{kind} {m}x{k} {config}{' staged' if stage else ''}"
                    out[key] = {"us": round(us, 2), "tb_s": round(w.nbytes / us / 1e6, 2)}
                    print(f"{key:40s} {us:8.2f} us {w.nbytes / us / 1e6:6.2f} TB/s", flush=True)
    k = kernels  # the step's other kernels, timed below
    dim, heads, kv_heads, d, ffn = 4096, 32, 8, 128, 14336
    x = cp.asarray(np.random.default_rng(1).standard_normal((1, dim)).astype(np.float32))
    delta, w = cp.zeros((1, dim), cp.float16), cp.ones(dim, cp.float32)
    qkv = cp.zeros((1, (heads + 2 * kv_heads) * d), cp.float16)
    angles = cp.zeros((20000, 1, d // 2), cp.float32)
    gate_up = cp.zeros((1, 2 * ffn), cp.float16)
    x16 = cp.zeros(14336, cp.float16)
    others = {"add_rms_norm 1x4096": lambda: k.add_rms_norm(x, delta, w, 1e-5),
              "quantize_q8 14336": lambda: k.quantize_q8(x16),
              "add_rms_norm 1x4096 +q8": lambda: k.add_rms_norm(x, delta, w, 1e-5, q8=True),
              "silu_mul 1x14336": lambda: k.silu_mul(gate_up),
              "silu_mul 1x14336 +q8": lambda: k.silu_mul(gate_up, q8=True)}
    for heads, kv_heads, d, label in [(32, 8, 128, "8B"), (9, 3, 64, "135M"), (64, 8, 128, "70B")]:
        q = cp.zeros((1, heads, d), cp.float16)
        for context in (512, 4096, 16384):
            held = -(-(context + 1) // BLOCK)  # a pool of the sequence's blocks, in table order
            kc = cp.asarray((np.random.default_rng(2).standard_normal((held, kv_heads, BLOCK, d)) * 0.3).astype(np.float16))
            vc = kc.copy()
            grid = bucket(context, 1 << 20)  # the decode graph's bucket on a context this long or longer
            step = k.batch_step([np.arange(held, dtype=np.int32)], (context,), max_keys=grid, block=BLOCK)
            if label == "8B":
                others[f"rope_store at {context}"] = lambda kc=kc, vc=vc, step=step: k.rope_store(qkv, angles, angles, kc, vc, step)
            others[f"decode attention {label} at {context} (grid for {grid})"] = (
                lambda q=q, kc=kc, vc=vc, step=step: k.attention(q, kc, vc, step, q8=True))
    for name, fn in others.items():
        us = time_us(fn)
        out[name] = {"us": round(us, 2)}
        print(f"{name:48s} {us:8.2f} us", flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
