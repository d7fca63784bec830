"""The fused decode kernels (quant.cu's matvec_act_<T>, matvec_norm_<T>: engine/kernels/fused_launch.py; moe.cu's
moe_act_<T>: MoeKernels.act) against the launches each replaces, byte for byte: gate/up's matvec then silu_mul, a
projection's matvec then the residual add and add_rms_norm (fp16 rows, their Q8 units, the residual stream), the
chosen experts' gate/up matvec then silu_mul. The same cases run on the host's
CUDA emulation in the suite (tests/engine/kernels/test_fused_host.py) and on a GPU (tools/device/
gpu_kernels_check.py --only fused), where the compiler's float rules are the GPU's own."""
from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType

from engine.core.experts import Experts, ExpertStack
from engine.core.quantized import BLOCKS, QuantMatrix, QuantPart, Row8
from tools.fixtures.make_synthetic_gguf import random_blocks

KINDS = ("Q4_K", "Q6_K", "Q4_1", "Q8_0", "IQ3_S")  # the 8B Q4_K_M's, the default model's, a hybrid's
SHAPES = ((768, 1536), (1024, 2048))  # (dim, ffn), whole K-quant blocks; on a GPU their matvecs are staged (stage.cuh)
GPU_SHAPES = (*SHAPES, (576, 1536), (4096, 14336))  # the default model's (no K-quant), the 8B's (read directly)


def matrix(xp, kind: str, rows: int, cols: int, rng) -> QuantMatrix:
    raw = random_blocks(rng, GGMLQuantizationType[kind], rows, cols, 0.05)
    return QuantMatrix((QuantPart(kind, xp.asarray(raw), rows),), cols)


def on_host(a) -> np.ndarray:
    """A device array's values on the host (CuPy's .get(); NumPy's as they are)."""
    return a.get() if hasattr(a, "get") else np.asarray(a)


def same(a, b) -> bool:
    """Byte for byte, wherever the arrays are."""
    a, b = on_host(a), on_host(b)
    return a.shape == b.shape and bool((a.view(np.uint8) == b.view(np.uint8)).all())


def row8(k, xp, rng, dim: int):
    """A decode row as a norm writes it (fp16 values and their Q8 units), the residual stream it came from
    (1, dim) float32 on the host, and the norm's weight (dim,) float32."""
    x0 = rng.standard_normal((1, dim)).astype(np.float32)
    weight = xp.asarray((1 + 0.1 * rng.standard_normal(dim)).astype(np.float32))
    return k.add_rms_norm(xp.asarray(x0), None, weight, 1e-5, q8=True), x0, weight


def act_case(k, xp, kind: str, dim: int, ffn: int, rng) -> bool:
    """matvec_act against gate/up's matvec then silu_mul."""
    h, _, _ = row8(k, xp, rng, dim)
    gate_up = matrix(xp, kind, 2 * ffn, dim, rng)
    want = k.silu_mul(k.matvec(gate_up, h.values, xp.float16, h.q8), q8=True)
    got = k.matvec_act(gate_up, h)
    return got is not None and same(got.values, want.values) and same(got.q8, want.q8)


def midpoint_weights(x, delta, eps: float) -> np.ndarray:
    """Norm weights (dim,) float32 that put each output of rms_norm(x + delta) * weight at a midpoint between two
    fp16 values, within a few fp32 ulps: which way an output rounds then follows the norm's fp32 scale to its
    last bit, so a scale summed in another order shows in a good share of the outputs (with ordinary weights,
    in one output of several thousand)."""
    v = (x + delta.astype(np.float32)).astype(np.float64).reshape(-1)
    t = v / np.sqrt(np.mean(v * v) + eps)  # each output before the weight, about
    low = t.astype(np.float16)
    high = np.nextafter(low, np.where(t >= low, np.inf, -np.inf).astype(np.float16))
    mid = (low.astype(np.float64) + high.astype(np.float64)) / 2
    return np.where(np.abs(t) > 1e-3, mid / np.where(t == 0, 1, t), 1.0).astype(np.float32)


def norm_case(k, xp, kind: str, dim: int, ffn: int, rng) -> bool:
    """matvec_norm against the projection's matvec then add_rms_norm (its output, units and residual stream)."""
    act = k.silu_mul(xp.asarray(rng.standard_normal((1, 2 * ffn)).astype(np.float16)), q8=True)  # as SwiGLU writes it
    x0 = rng.standard_normal((1, dim)).astype(np.float32)
    down = matrix(xp, kind, dim, ffn, rng)
    delta = k.matvec(down, act.values, xp.float16, act.q8)
    weight = xp.asarray(midpoint_weights(x0, on_host(delta), 1e-5))
    x_want, x_got = xp.asarray(x0.copy()), xp.asarray(x0.copy())
    want = k.add_rms_norm(x_want, delta, weight, 1e-5, q8=True)
    got = k.matvec_norm(down, act, x_got, weight, 1e-5)
    return got is not None and all(same(a, b) for a, b in ((got.values, want.values), (got.q8, want.q8),
                                                                     (x_got, x_want)))


def fused_cases(k, xp, kinds=KINDS, shapes=SHAPES, seed: int = 5):
    """(kernel, case, ok) for each kind and shape: k a GpuKernels (or its launchers over the host's kernels), xp
    its array module."""
    rng = np.random.default_rng(seed)
    k.fused_matvec = True  # (opt-in in the engine: engine/kernels/fused_launch.py)
    for kind in kinds:
        for dim, ffn in shapes:
            if dim % BLOCKS[kind][0] == 0 and ffn % BLOCKS[kind][0] == 0:
                yield f"matvec_act_{kind}", f"dim={dim} ffn={ffn}", act_case(k, xp, kind, dim, ffn, rng)
                yield f"matvec_norm_{kind}", f"dim={dim} ffn={ffn}", norm_case(k, xp, kind, dim, ffn, rng)


def moe_act_case(moe, xp, kind: str, experts: int, dim: int, ffn: int, tokens: int, used: int, rng) -> bool:
    """MoeKernels.act (moe_act_<kind>) against act_apart (moe_matvec then silu_mul) for `tokens` decode rows each
    with `used` of `experts` experts: the activations and their Q8 units."""
    stacks = [ExpertStack(kind, xp.asarray(random_blocks(rng, GGMLQuantizationType[kind], experts * ffn, dim, 0.05)),
                          experts, ffn, dim) for _ in range(2)]
    down = ExpertStack(kind, xp.asarray(random_blocks(rng, GGMLQuantizationType[kind], experts * dim, ffn, 0.05)),
                       experts, dim, ffn)
    rows = [row8(moe.kernels, xp, rng, dim)[0] for _ in range(tokens)]  # each a norm's output with its units
    h = Row8(xp.concatenate([r.values for r in rows]), xp.concatenate([r.q8 for r in rows]))
    chosen = xp.asarray(np.stack([rng.choice(experts, used, replace=False) for _ in range(tokens)]).astype(np.int32))
    got = moe.act(h, *stacks, chosen)
    want = moe.act_apart(h, Experts(*stacks, down), chosen)
    return same(got.values, want.values) and same(got.q8, want.q8)
