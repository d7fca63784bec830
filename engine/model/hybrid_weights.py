"""A hybrid model's layers from its GGUF (qwen3next, qwen35, qwen35moe: engine/model/hybrid.py), into
the forward pass's layouts, on either backend (the rows picked and reordered as the file's blocks or values:
engine/model/weights.py's TensorRows.order).

As llama.cpp's converter writes them (its conversion/qwen.py):
- a Gated DeltaNet layer: `attn_qkv` ([q | k | v], the convolution's channel order) and `attn_gate` (z),
  split from transformers' in_proj_qkvz (older qwen3next files keep it whole as `ssm_in`: per k head
  [q (dk) | k (dk) | v (r*dv) | z (r*dv)], r = v_heads / k_heads); qwen3next's `ssm_ba` per k head
  [b (r) | a (r)], qwen35's `ssm_beta` and `ssm_alpha`; `ssm_conv1d` (channels, kernel), `ssm_a` =
  -exp(A_log), `ssm_dt.bias`, `ssm_norm` (the gated norm's weight, as trained), `ssm_out`. qwen35's value
  heads are tiled (HybridConfig.tiled), qwen3next's grouped;
- a gated attention layer: `attn_q` holds, per head, [q (d) | gate (d)];
- the other RMSNorm weights are stored with transformers' 1 + w already added.
A Gated DeltaNet layer's in-projection becomes one matrix whose rows the forward splits, [q | k | v | z | b |
a]; a gated attention's becomes [q | k | v] (as a Qwen3 layer's, so that the same RoPE, norm and cache kernels
serve it) and the gate's rows a matrix of their own.

Partial rotary embedding (RoPE on the first `rope_dim` of each head's d values, half-split) is laid out as a
full-width one: each Q and K head's rows (and its norm's weights) are reordered to [rotated first half |
unrotated first half | rotated second half | unrotated second half], and the frequencies past rope_dim / 2
are zero (engine/model/hybrid.py), so a full half-split rotation turns the first pairs as the partial one
would and leaves the others as they are (cos 1, sin 0); q.k is the same sum in another order."""
from __future__ import annotations

import numpy as np

from engine.model.layer_weights import LayerWeights, LinearAttentionWeights
from engine.modelfile.model_config import ModelLoadError


def grouped_order(groups: int, widths: list[int]) -> list[np.ndarray]:
    """Rows laid out per group as pieces of `widths` -> for each piece, its rows of every group in group order
    (row indices)."""
    size, bounds = sum(widths), np.cumsum([0, *widths])
    return [np.concatenate([np.arange(g * size + lo, g * size + hi) for g in range(groups)])
            for lo, hi in zip(bounds[:-1], bounds[1:])]


def partial_rope_order(d: int, rot: int) -> np.ndarray:
    """One head's d values in the full-width layout of a `rot`-wide half-split RoPE (module docstring)."""
    hr, hp = rot // 2, (d - rot) // 2
    return np.concatenate([np.arange(hr), rot + np.arange(hp), hr + np.arange(hr), rot + hp + np.arange(hp)])


def heads_order(heads: int, d: int, one: np.ndarray) -> np.ndarray:
    """`one` (a head's value order) applied to each of `heads` heads of d rows."""
    return (np.arange(heads)[:, None] * d + one).reshape(-1)


def linear_attention(loader, p: str) -> LinearAttentionWeights:
    """Layer prefix p's Gated DeltaNet weights (loader: engine/model/weights.py's WeightLoader)."""
    h = loader.cfg.hybrid
    r = h.v_heads // h.k_heads
    names = loader.tensors
    if p + "ssm_in.weight" in names:  # [q | k | v | z] from per-k-head groups
        tensors, orders = [p + "ssm_in.weight"], [np.concatenate(grouped_order(h.k_heads, [h.dk, h.dk, r * h.dv,
                                                                                               r * h.dv]))]
    else:  # [q | k | v] and z as they are
        tensors, orders = [p + "attn_qkv.weight", p + "attn_gate.weight"], [None, None]
    if p + "ssm_ba.weight" in names:  # [b | a] from per-k-head groups
        tensors.append(p + "ssm_ba.weight")
        orders.append(np.concatenate(grouped_order(h.k_heads, [r, r])))
    else:
        tensors += [p + "ssm_beta.weight", p + "ssm_alpha.weight"]
        orders += [None, None]
    conv = loader.small_matrix(p + "ssm_conv1d.weight")  # (channels, kernel) float32
    if conv.shape != (h.channels, h.conv_kernel):
        raise ModelLoadError(f"{p}ssm_conv1d.weight is {conv.shape}, expected {(h.channels, h.conv_kernel)}")
    return LinearAttentionWeights(
        w_in=loader.matrices(tensors, [None] * len(tensors), orders=orders), conv=conv,
        a=loader.vector(p + "ssm_a").reshape(-1), dt_bias=loader.vector(p + "ssm_dt.bias").reshape(-1),
        norm=loader.vector(p + "ssm_norm.weight").reshape(-1), w_out=loader.matrix(p + "ssm_out.weight"))


def gated_attention(loader, p: str, layer: LayerWeights) -> None:
    """Layer prefix p's gated attention into `layer`: wqkv [q | k | v] (Q and K heads in the partial RoPE's
    full-width layout), w_gate (heads*d, dim), wo, and the Q/K norms' weights in the same layout."""
    c, h = loader.cfg, loader.cfg.hybrid
    d = c.head_dim
    one = partial_rope_order(d, h.rope_dim)
    q_rows, gate_rows = grouped_order(c.n_heads, [d, d])
    q = p + "attn_q.weight"
    layer.wqkv = loader.matrices([q, p + "attn_k.weight", p + "attn_v.weight"], [None] * 3,
                                 orders=[q_rows[heads_order(c.n_heads, d, one)], heads_order(c.n_kv_heads, d, one),
                                         None])
    layer.w_gate = loader.matrices([q], [None], orders=[gate_rows])
    layer.wo = loader.matrix(p + "attn_output.weight")
    on_device = loader.xp.asarray(one)
    layer.q_norm = loader.vector(p + "attn_q_norm.weight")[on_device]
    layer.k_norm = loader.vector(p + "attn_k_norm.weight")[on_device]


def hybrid_layer(loader, i: int):
    """Layer i of a hybrid model as engine/model/weights.py's LayerWeights (with `linear` set on a
    Gated DeltaNet layer, `shared_gate` on a layer with a shared expert)."""
    c, p = loader.cfg, f"blk.{i}."
    layer = LayerWeights(attn_norm=loader.vector(p + "attn_norm.weight"), wqkv=None, wo=None,
                         ffn_norm=loader.vector(p + "post_attention_norm.weight"))
    if i in c.hybrid.attention_layers:
        gated_attention(loader, p, layer)
    else:
        layer.linear = linear_attention(loader, p)
    if c.n_experts:
        layer.router = loader.small_matrix(p + "ffn_gate_inp.weight")
        layer.experts = loader.experts(p)
        if c.hybrid.shared_ffn_dim:
            layer.w_gate_up = loader.matrices([p + "ffn_gate_shexp.weight", p + "ffn_up_shexp.weight"], [None, None])
            layer.w_down = loader.matrix(p + "ffn_down_shexp.weight")
            layer.shared_gate = loader.small_matrix(p + "ffn_gate_inp_shexp.weight").reshape(1, -1)
    else:
        layer.w_gate_up = loader.matrices([p + "ffn_gate.weight", p + "ffn_up.weight"], [None, None])
        layer.w_down = loader.matrix(p + "ffn_down.weight")
    return layer
