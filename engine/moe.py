"""A mixture-of-experts feed-forward (qwen3moe): each token's router picks its top-k experts, and
the layer's output is their outputs weighted by the router's probabilities. Written over the
backend's operations like the rest of the forward pass; the NumPy path is the reference.

Routing (as Qwen3-MoE and llama.cpp do it): probabilities = softmax of the router logits over all
experts (float32); the k most probable experts, ties to the lower index; their probabilities,
rescaled to sum to 1 when the model says so (expert_weights_norm).
"""
from __future__ import annotations

import numpy as np


def route(xp, logits, k: int, normalize: bool):
    """logits: (n, experts) float32 -> (experts (n, k) int64 in descending probability, weights (n, k)
    float32)."""
    logits = logits.astype(np.float32, copy=False)
    p = xp.exp(logits - logits.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    chosen = xp.argsort(-p, axis=-1, kind="stable")[:, :k] if xp is np else xp.argsort(-p, axis=-1)[:, :k]
    weights = xp.take_along_axis(p, chosen, axis=-1)
    if normalize:
        weights = weights / weights.sum(axis=-1, keepdims=True)
    return chosen.astype(np.int64), weights.astype(np.float32)


def run_experts(ops, h, experts: list, chosen, weights):
    """h: (n, dim) -> (n, dim) in h's dtype: sum over each token's chosen experts e of
    weight * down_e(silu(gate_e h) * up_e h). The tokens routed to one expert go through it
    together (one GEMM per used expert in a prompt chunk, a matvec in a decode step)."""
    xp = ops.xp
    out = xp.zeros(h.shape, dtype=np.float32)
    host = chosen if xp is np else xp.asnumpy(chosen)
    for e in np.unique(host):
        rows, slot = (xp.asarray(a) for a in np.nonzero(host == e))
        gate_up, down = experts[int(e)]
        y = ops.matmul(ops.silu_mul(ops.matmul(h[rows], gate_up)), down)
        out[rows] += weights[rows, slot][:, None] * y.astype(np.float32)
    return out.astype(h.dtype)
