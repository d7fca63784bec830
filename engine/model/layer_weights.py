"""A model's weights as the forward pass reads them, one LayerWeights a layer (made by
engine/model/weights.py from a GGUF)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from engine.core.experts import Experts


@dataclass
class LinearAttentionWeights:
    """A hybrid's Gated DeltaNet layer (engine/model/hybrid.py), in the backend's weight form (the small
    tensors float32)."""

    w_in: np.ndarray  # (channels + v_heads*dv + 2*v_heads, dim): rows [q | k | v | z | b | a]
    conv: np.ndarray  # (channels, kernel) float32
    a: np.ndarray  # (v_heads,) float32: A = -exp(A_log) < 0
    dt_bias: np.ndarray  # (v_heads,) float32
    norm: np.ndarray  # (dv,) float32: the gated RMSNorm's weight
    w_out: np.ndarray  # (dim, v_heads*dv)


@dataclass
class LayerWeights:
    """Weights as GGUF stores them, (out_features, in_features): float32 on the CPU; on the GPU fp16,
    or a QuantMatrix of the file's blocks (engine/core/quantized.py) for a quantized tensor."""

    attn_norm: object  # (dim,) float32
    wqkv: object  # (q_dim + 2*kv_dim, dim): llama's q and k rows de-interleaved for half-split RoPE
    wo: object  # (dim, q_dim)
    ffn_norm: object  # (dim,) float32
    w_gate_up: object = None  # (2*ffn_dim, dim); None in a MoE layer
    w_down: object = None  # (dim, ffn_dim)
    bqkv: object = None  # (q_dim + 2*kv_dim,) qwen2's Q, K and V biases
    q_norm: object = None  # (head_dim,) float32: qwen3's per-head norms
    k_norm: object = None
    router: object = None  # (n_experts, dim) float32: qwen3moe's gate
    experts: Experts | None = None  # the stacked expert tensors (engine/ops/moe.py)
    linear: LinearAttentionWeights | None = None  # a hybrid's Gated DeltaNet layer (no wqkv, wo then)
    shared_gate: object = None  # (1, dim) float32: a hybrid's shared expert's gate (w_gate_up, w_down its weights)
    w_gate: object = None  # (q_dim, dim): a hybrid's gated attention's gate (engine/model/hybrid_weights.py)


@dataclass
class Weights:
    tok_embd: object  # (vocab, dim)
    layers: list[LayerWeights]
    out_norm: object  # (dim,) float32
    head: object  # (vocab, dim); tok_embd itself when tied
