"""What each kernel of a Qwen3-30B-A3B-shaped decode step costs on the GPU, timed per launch as
tools/profiling/decode_kernel_times.py times them (launches captured in a graph and replayed): one layer's
kernels in the order the step runs them, on random Q4_K weights (Q6_K for attn_v and the head, as
Q4_K_M files have them), and their sum over the 48 layers beside the measured step.

    python tools/profiling/moe_decode_times.py [--json OUT] [--define NAME=VALUE ...]
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import cupy as cp  # noqa: E402

from engine.kernels import GpuKernels  # noqa: E402
from engine.core.quantized import QuantMatrix, QuantPart, Row8  # noqa: E402
from tools.device.gpu_kernels_check import expert_stacks, half_normal, weight_rows  # noqa: E402
from tools.profiling.decode_kernel_times import time_us  # noqa: E402

LAYERS, DIM, HEADS, KV_HEADS, D, EXPERTS, USED, FFN, VOCAB = 48, 2048, 32, 4, 128, 128, 8, 768, 151936


def matrix(parts: list[tuple[str, int]], cols: int) -> QuantMatrix:
    return QuantMatrix(tuple(QuantPart(kind, cp.asarray(weight_rows(kind, rows, cols)[0]), rows)
                             for kind, rows in parts), cols)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--json")
    p.add_argument("--context", type=int, default=512)
    p.add_argument("--define", action="append", default=[], metavar="NAME=VALUE",
                   help="a macro for every kernel file (e.g. MOE_UNROLL=1): a kernel's variants timed")
    a = p.parse_args()
    k = GpuKernels(cp, tuple(a.define))
    x = cp.asarray(np.random.default_rng(0).standard_normal((1, DIM)).astype(np.float32))
    delta, norm_w = cp.asarray(half_normal(1, DIM)), cp.ones(DIM, dtype=cp.float32)
    wqkv = matrix([("Q4_K", (HEADS + KV_HEADS) * D), ("Q6_K", KV_HEADS * D)], DIM)
    wo = matrix([("Q4_K", DIM)], HEADS * D)
    head = matrix([("Q6_K", VOCAB)], DIM)
    experts, _ = expert_stacks("Q4_K", EXPERTS, DIM, FFN)
    router = cp.asarray((np.random.default_rng(1).standard_normal((EXPERTS, DIM)) * 0.05).astype(np.float32))
    ctx = 1 << max(10, math.ceil(math.log2(a.context + 1)))
    kc, vc = (cp.asarray(half_normal(KV_HEADS, ctx, D)) for _ in range(2))
    qkv = cp.asarray(half_normal(1, (HEADS + 2 * KV_HEADS) * D))
    qn = kn = cp.ones(D, dtype=cp.float32)
    table = cp.asarray(np.ones((ctx, 1, D // 2), dtype=np.float32))
    step = k.static_step(1, ctx)
    step.set_position(a.context)
    h = k.add_rms_norm(x, delta, norm_w, 1e-6, q8=True)
    q = k.rope_store(qkv, table, table, kc, vc, step)
    attn = k.attention(q, kc, vc, step, q8=True)
    chosen, weights = k.moe.route(h.values, router, USED, True, decode=True)
    gate_up = cp.asarray(half_normal(USED, 2 * FFN))
    act = k.silu_mul(gate_up, q8=True)
    layer = {
        "add_rms_norm +q8 (x2)": lambda: k.add_rms_norm(x, delta, norm_w, 1e-6, q8=True),
        "qkv matvec (Q4_K + Q6_K)": lambda: k.matvec(wqkv, h.values[0], cp.float16, h.q8),
        "Q/K norms + rope_store": lambda: k.rope_store(qkv, table, table, kc, vc, step, (qn, kn, 1e-6)),
        f"decode attention at {a.context}": lambda: k.attention(q, kc, vc, step, q8=True),
        "wo matvec": lambda: k.matvec(wo, attn.values[0], cp.float16, attn.q8),
        "router_route": lambda: k.moe.route(h.values, router, USED, True, decode=True),
        "gate + up (one moe_matvec)": lambda: k.moe.launch("moe_matvec", experts.gate, (2 * USED, 1), (
            chosen, np.int32(USED), h.q8, gate_up, np.int32(2 * FFN)), experts.up.data),
        "silu_mul +q8": lambda: k.silu_mul(gate_up, q8=True),
        "moe_down": lambda: k.moe.down(experts.down, act.q8, chosen, weights),
        "moe decode (all of the above four)": lambda: k.moe.decode(Row8(h.values, h.q8), experts, chosen, weights),
    }
    times = {name: round(time_us(fn), 2) for name, fn in layer.items()}
    times["add_rms_norm +q8 (x2)"] *= 2
    per_layer = sum(v for name, v in times.items() if not name.startswith("moe decode"))
    out = {"layer_us": times, "layer_sum_us": round(per_layer, 1),
           "head_matvec_us": round(time_us(lambda: k.matvec(head, h.values[0], cp.float32, h.q8)), 1),
           "kernels_per_layer": 10}
    out["step_sum_ms"] = round((per_layer * LAYERS + out["head_matvec_us"]) / 1000, 3)
    print(json.dumps(out, indent=1))
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
