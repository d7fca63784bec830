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


class Layer:
    """A mixture layer's prompt pass on `moe` (engine/kernels/moe_launch.py MoeKernels: the GPU's, or the host's in a
    test) over arrays of `xp`: n rows of width dim routed to `used` of `experts` (ffn wide), in `kind` blocks."""

    def __init__(self, xp, moe, kind: str, n: int, experts: int, used: int, dim: int, ffn: int, rng):
        from engine.kernels.moe_launch import GEMM_BM

        self.xp, self.moe, self.n, self.k, self.dim, self.ffn = xp, moe, n, used, dim, ffn
        self.h = xp.asarray((rng.standard_normal((n, dim)) * 0.5).astype(np.float16))  # (n, dim)
        picks = np.stack([rng.choice(experts, used, replace=False) for _ in range(n)]).astype(np.int32)  # (n, used)
        self.chosen = xp.asarray(picks)
        self.weights = xp.asarray(rng.dirichlet(np.ones(used), n).astype(np.float32))  # (n, used)
        self.router = xp.asarray((rng.standard_normal((experts, dim)) * 0.05).astype(np.float32))  # (experts, dim)
        self.experts = stacks(xp, kind, experts, dim, ffn, rng)
        entries = self.entries = n * used
        # the grouping moe.prompt makes, for the grouped GEMMs alone
        self.offsets, self.tiles = xp.empty(experts + 1, dtype=np.int32), xp.empty(experts + 1, dtype=np.int32)
        order, inv = xp.empty(entries, dtype=np.int32), xp.empty(entries, dtype=np.int32)
        moe.fn["moe_sort"]((1,), (1024,), (self.chosen, np.int32(entries), np.int32(experts), self.offsets, self.tiles,
                                           order, inv))
        self.groups = (order, self.offsets, self.tiles, np.int32(experts))
        self.row_tiles = -(-entries // GEMM_BM) + experts
        self.gate_up = xp.empty((entries, 2 * ffn), dtype=np.float16)
        self.act = xp.empty((entries, ffn), dtype=np.float16)
        self.down = xp.empty((entries, dim), dtype=np.float16)

    def launches(self) -> dict:
        """What is timed: the route (the prompt's router and moe_route), the gate's grouped GEMM (the up's is the
        same), the down's, and the whole pass (sort, gate, up, SwiGLU, down, combine)."""
        moe, x = self.moe, self.experts
        return {"route": lambda: moe.route(self.h, self.router, self.k, True),
                "gate": lambda: moe.gemm(x.gate, self.h, self.k, self.groups, self.gate_up, 2 * self.ffn,
                                         self.row_tiles),
                "down": lambda: moe.gemm(x.down, self.act, 0, self.groups, self.down, self.dim, self.row_tiles),
                "pass": lambda: moe.prompt(self.h, x, self.chosen, self.weights)}

    def flops(self) -> dict:
        return {"gate": 2 * self.entries * self.ffn * self.dim, "down": 2 * self.entries * self.dim * self.ffn}

    def digest(self, host) -> str:
        """The pass's output (n, dim) fp16, by its bytes: `host` brings it to the host."""
        return hashlib.blake2b(host(self.launches()["pass"]()).tobytes(), digest_size=8).hexdigest()


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

    moe = GpuKernels(cp).moe
    rng = np.random.default_rng(11)
    out = {"label": a.label, "device": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(), "rows": a.rows,
           "experts": a.experts, "used": a.used, "dim": a.dim, "ffn": a.ffn, "kinds": {}}
    for kind in a.kinds.split(","):
        layer = Layer(cp, moe, kind, a.rows, a.experts, a.used, a.dim, a.ffn, rng)
        digest = layer.digest(cp.asnumpy)
        if a.once:
            print(f"{kind}: one pass, output {digest}", flush=True)
            continue
        ms = {key: timed(cp, fn, launches=5 if key == "pass" else 20) for key, fn in layer.launches().items()}
        flops = layer.flops()
        row = {"ms": {key: round(v, 4) for key, v in ms.items()}, "output": digest,
               "tflops": {key: round(flops[key] / ms[key] / 1e9, 1) for key in flops},
               "of_tensor_cores": {key: round(flops[key] / ms[key] / 1e9 / H100_DENSE_FP16_TFLOPS, 4) for key in flops},
               "tiles": int(cp.asnumpy(layer.tiles)[-1])}
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
