"""A mixture-of-experts feed-forward (qwen3moe): each token's router picks its top-k experts, and
the layer's output is their outputs weighted by the router's probabilities. The NumPy path (the
weights' layout is engine/core/experts.py), which is the reference the GPU kernels (engine/kernels/moe.cu) are checked
against.

Routing (as Qwen3-MoE and llama.cpp do it): probabilities = softmax of the router logits over all
experts (float32); the k most probable experts, ties to the lower index; their probabilities,
rescaled to sum to 1 when the model says so (expert_weights_norm).
"""
from __future__ import annotations

import numpy as np

from engine.core.experts import Experts


def route(logits: np.ndarray, k: int, normalize: bool):
    """logits: (n, experts) float32 -> (experts (n, k) int64 in descending probability, weights (n, k)
    float32)."""
    logits = logits.astype(np.float32, copy=False)
    p = np.exp(logits - logits.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    chosen = np.argsort(-p, axis=-1, kind="stable")[:, :k]
    weights = np.take_along_axis(p, chosen, axis=-1)
    if normalize:
        weights = weights / weights.sum(axis=-1, keepdims=True)
    return chosen.astype(np.int64), weights.astype(np.float32)


def run_experts(ops, h, experts: Experts, chosen, weights, slots=None):
    """h: (n, dim) float32 -> (n, dim): sum over each token's chosen experts e of
    weight * down_e(silu(gate_e h) * up_e h). The tokens routed to one expert go through it
    together (one GEMM per used expert), the experts in the order of their numbers. slots: chosen
    renamed to where each expert's matrices are in `experts` (an expert cache's slots; None: chosen)."""
    out = np.zeros(h.shape, dtype=np.float32)
    for e in np.unique(chosen):
        rows, slot = np.nonzero(chosen == e)
        at = e if slots is None else slots[rows[0], slot[0]]
        x = h[rows]
        gate_up = np.concatenate([ops.matmul(x, experts.gate.expert(at)), ops.matmul(x, experts.up.expert(at))], axis=1)
        y = ops.matmul(ops.silu_mul(gate_up), experts.down.expert(at))
        out[rows] += weights[rows, slot][:, None] * y
    return out.astype(h.dtype)
