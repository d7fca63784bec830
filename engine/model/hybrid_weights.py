"""A hybrid model's layers from its GGUF (qwen3next, qwen35, qwen35moe: engine/model/hybrid.py), into
the forward pass's layouts. On the CPU only for now (float32 values; the GPU refuses these files).

As llama.cpp's converter writes them (its conversion/qwen.py):
- a Gated DeltaNet layer: `attn_qkv` ([q | k | v], the convolution's channel order) and `attn_gate` (z),
  split from transformers' in_proj_qkvz (older qwen3next files keep it whole as `ssm_in`: per k head
  [q (dk) | k (dk) | v (r*dv) | z (r*dv)], r = v_heads / k_heads); qwen3next's `ssm_ba` per k head
  [b (r) | a (r)], qwen35's `ssm_beta` and `ssm_alpha`; `ssm_conv1d` (channels, kernel), `ssm_a` =
  -exp(A_log), `ssm_dt.bias`, `ssm_norm` (the gated norm's weight, as trained), `ssm_out`. qwen35's value
  heads are tiled (HybridConfig.tiled), qwen3next's grouped;
- a gated attention layer: `attn_q` holds, per head, [q (d) | gate (d)];
- the other RMSNorm weights are stored with transformers' 1 + w already added.
Both become one matrix per layer whose rows the forward splits: [q | k | v | z | b | a] and
[q | gate | k | v]."""
from __future__ import annotations

import numpy as np

from engine.model.layer_weights import LayerWeights, LinearAttentionWeights
from engine.modelfile.model_config import ModelLoadError


def grouped_rows(w: np.ndarray, groups: int, widths: list[int]) -> list[np.ndarray]:
    """w's rows laid out per group as pieces of `widths` -> each piece's rows of every group, in group
    order: (groups*sum(widths), cols) -> [(groups*widths[i], cols)]."""
    per = w.reshape(groups, sum(widths), w.shape[-1])
    bounds = np.cumsum([0, *widths])
    return [per[:, lo:hi].reshape(-1, w.shape[-1]) for lo, hi in zip(bounds[:-1], bounds[1:])]


def stacked(parts: list[np.ndarray]) -> np.ndarray:
    """Rows stacked, column-major as the CPU's weights are (engine/model/weights.py, host_matrix)."""
    return np.asfortranarray(np.concatenate(parts))


def linear_attention(loader, p: str) -> LinearAttentionWeights:
    """Layer prefix p's Gated DeltaNet weights (loader: engine/model/weights.py's WeightLoader)."""
    h = loader.cfg.hybrid
    r = h.v_heads // h.k_heads
    names = loader.tensors
    if p + "ssm_in.weight" in names:  # [q | k | v | z] from per-k-head groups
        rows = grouped_rows(loader.matrix(p + "ssm_in.weight"), h.k_heads, [h.dk, h.dk, r * h.dv, r * h.dv])
    else:  # [q | k | v] and z as they are
        rows = [loader.matrices([p + "attn_qkv.weight", p + "attn_gate.weight"], [None, None])]
    if p + "ssm_ba.weight" in names:  # [b | a] from per-k-head groups
        rows += grouped_rows(loader.matrix(p + "ssm_ba.weight"), h.k_heads, [r, r])
    else:
        rows.append(loader.matrices([p + "ssm_beta.weight", p + "ssm_alpha.weight"], [None, None]))
    conv = np.asarray(loader.small_matrix(p + "ssm_conv1d.weight"), dtype=np.float32)  # (channels, kernel)
    if conv.shape != (h.channels, h.conv_kernel):
        raise ModelLoadError(f"{p}ssm_conv1d.weight is {conv.shape}, expected {(h.channels, h.conv_kernel)}")
    return LinearAttentionWeights(
        w_in=stacked(rows), conv=conv, a=loader.vector(p + "ssm_a").reshape(-1),
        dt_bias=loader.vector(p + "ssm_dt.bias").reshape(-1), norm=loader.vector(p + "ssm_norm.weight").reshape(-1),
        w_out=loader.matrix(p + "ssm_out.weight"))


def gated_attention_qkv(loader, p: str) -> np.ndarray:
    """[q | gate | k | v] rows of layer prefix p's gated attention, (2*heads*d + 2*kv_heads*d, dim)."""
    c = loader.cfg
    q, gate = grouped_rows(loader.matrix(p + "attn_q.weight"), c.n_heads, [c.head_dim, c.head_dim])
    return stacked([q, gate, loader.matrix(p + "attn_k.weight"), loader.matrix(p + "attn_v.weight")])


def hybrid_layer(loader, i: int):
    """Layer i of a hybrid model as engine/model/weights.py's LayerWeights (with `linear` set on a
    Gated DeltaNet layer, `shared_gate` on a layer with a shared expert)."""
    c, p = loader.cfg, f"blk.{i}."
    layer = LayerWeights(attn_norm=loader.vector(p + "attn_norm.weight"), wqkv=None, wo=None,
                         ffn_norm=loader.vector(p + "post_attention_norm.weight"))
    if i in c.hybrid.attention_layers:
        layer.wqkv, layer.wo = gated_attention_qkv(loader, p), loader.matrix(p + "attn_output.weight")
        layer.q_norm, layer.k_norm = loader.vector(p + "attn_q_norm.weight"), loader.vector(p + "attn_k_norm.weight")
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
