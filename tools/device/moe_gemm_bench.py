"""The routed experts' prompt pass alone on the GPU (engine/kernels/moe.cu: moe_sort, moe_gemm over the gate, up
and down stacks, silu_mul, moe_combine, through MoeKernels.prompt), on a mixture's shapes: by default the
Qwen3-Next-80B-A3B shape's layer (512 experts of 2,048 x 512, 10 a token) over a 4,096-row prompt step, routed at
random. Per stack type: the time of the route (the router's logits and moe_route: the prompt's routing, done before
the pass), of each grouped GEMM and of the whole pass (medians), the tensor-core rate it
reaches (2 x entries x rows x cols flops) and the weights it decodes a second, against the chip's limits; and the
output's digest, so that a kernel change that must keep the bits can be compared across trees.

    python tools/device/moe_gemm_bench.py [--kinds Q4_K,IQ3_S,Q6_K] [--rows 4096] [--experts 512] [--used 10]
        [--dim 2048] [--ffn 512] [--json FILE --label NAME]

Under Nsight Compute (`--once`: one pass per kind after a warm-up, nothing timed):
    ncu --kernel-name regex:moe_gemm --set full --launch-count 3 python tools/device/moe_gemm_bench.py --once
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tools.device.mmv_check import timed  # noqa: E402

H100_DENSE_FP16_TFLOPS = 989  # the H100 SXM's dense fp16 tensor-core rate (the H200's is the same)


def stacks(cp, kind: str, experts: int, dim: int, ffn: int, rng):
    """Experts of random blocks of `kind` on the device: gate and up (experts*ffn, dim), down (experts*dim, ffn)."""
    from gguf import GGMLQuantizationType as Q

    from engine.core.experts import Experts, ExpertStack
    from tools.fixtures.make_synthetic_gguf import random_blocks

    def stack(rows: int, cols: int) -> ExpertStack:
        raw = random_blocks(rng, Q[kind], experts * rows, cols, 0.02).reshape(experts * rows, -1)
        return ExpertStack(kind, cp.asarray(raw), experts, rows, cols)

    return Experts(stack(ffn, dim), stack(ffn, dim), stack(dim, ffn))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kinds", default="Q4_K,IQ3_S,Q6_K")
    p.add_argument("--rows", type=int, default=4096, help="prompt rows of the step")
    p.add_argument("--experts", type=int, default=512)
    p.add_argument("--used", type=int, default=10, help="experts a row is routed to")
    p.add_argument("--dim", type=int, default=2048)
    p.add_argument("--ffn", type=int, default=512, help="an expert's width")
    p.add_argument("--once", action="store_true", help="one pass per kind, nothing timed (under ncu)")
    p.add_argument("--json")
    p.add_argument("--label", default="moe_gemm")
    a = p.parse_args()
    import cupy as cp

    from engine.kernels import GpuKernels
    from engine.kernels.moe_launch import GEMM_BM

    kernels = GpuKernels(cp)
    moe = kernels.moe
    rng = np.random.default_rng(11)
    n, k = a.rows, a.used
    h = cp.asarray((rng.standard_normal((n, a.dim)) * 0.5).astype(np.float16))
    chosen = cp.asarray(np.stack([rng.choice(a.experts, k, replace=False) for _ in range(n)]).astype(np.int32))
    weights = cp.asarray(rng.dirichlet(np.ones(k), n).astype(np.float32))
    router = cp.asarray((rng.standard_normal((a.experts, a.dim)) * 0.05).astype(np.float32))  # (experts, dim)
    entries = n * k
    out = {"label": a.label, "device": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(), "rows": n,
           "experts": a.experts, "used": k, "dim": a.dim, "ffn": a.ffn, "kinds": {}}
    for kind in a.kinds.split(","):
        experts = stacks(cp, kind, a.experts, a.dim, a.ffn, rng)
        y = moe.prompt(h, experts, chosen, weights)
        cp.cuda.Device().synchronize()
        digest = hashlib.blake2b(cp.asnumpy(y).tobytes(), digest_size=8).hexdigest()
        if a.once:
            print(f"{kind}: one pass, output {digest}", flush=True)
            continue
        # the grouped GEMMs alone, on the grouping moe.prompt makes
        count = a.experts
        offsets, tiles = cp.empty(count + 1, dtype=cp.int32), cp.empty(count + 1, dtype=cp.int32)
        order, inv = cp.empty(entries, dtype=cp.int32), cp.empty(entries, dtype=cp.int32)
        moe.fn["moe_sort"]((1,), (1024,), (chosen, np.int32(entries), np.int32(count), offsets, tiles, order, inv))
        groups = (order, offsets, tiles, np.int32(count))
        row_tiles = -(-entries // GEMM_BM) + count
        gate_up = cp.empty((entries, 2 * a.ffn), dtype=cp.float16)
        act = cp.empty((entries, a.ffn), dtype=cp.float16)
        down = cp.empty((entries, a.dim), dtype=cp.float16)
        ms = {
            "route": timed(cp, lambda: moe.route(h, router, k, True)),  # the prompt's router and route
            "gate": timed(cp, lambda: moe.gemm(experts.gate, h, k, groups, gate_up, 2 * a.ffn, row_tiles)),
            "down": timed(cp, lambda: moe.gemm(experts.down, act, 0, groups, down, a.dim, row_tiles)),
            "pass": timed(cp, lambda: moe.prompt(h, experts, chosen, weights), launches=5),
        }
        flops = {"gate": 2 * entries * a.ffn * a.dim, "down": 2 * entries * a.dim * a.ffn}
        row = {"ms": {key: round(v, 4) for key, v in ms.items()}, "output": digest,
               "tflops": {key: round(flops[key] / ms[key] / 1e9, 1) for key in flops},
               "of_tensor_cores": {key: round(flops[key] / ms[key] / 1e9 / H100_DENSE_FP16_TFLOPS, 4) for key in flops},
               "tiles": int(cp.asnumpy(tiles)[-1])}
        out["kinds"][kind] = row
        print(f"{kind}: route {ms['route']:.3f} ms, gate {ms['gate']:.3f} ms ({row['tflops']['gate']} TFLOP/s, "
              f"{100 * row['of_tensor_cores']['gate']:.1f}% of the tensor cores), down {ms['down']:.3f} ms "
              f"({row['tflops']['down']} TFLOP/s), whole pass {ms['pass']:.3f} ms; {row['tiles']} row tiles; "
              f"output {digest}", flush=True)
    if a.json:
        path = Path(a.json)
        runs = json.loads(path.read_text()) if path.exists() else {}
        runs[a.label] = out
        path.write_text(json.dumps(runs, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
