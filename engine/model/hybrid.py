"""The forward pass of the hybrid linear-attention families (qwen3next, qwen35, qwen35moe): Gated
DeltaNet layers (the backend's delta_net: engine/ops/hybrid_ops.py) with, every `full_attention_interval` layers, a gated
full-attention layer; a routed mixture of experts with a shared expert (or a dense feed-forward).

Per layer: x += mixer(norm(x)); x += ffn(norm(x)), where the mixer is one of
- Gated DeltaNet: one projection gives q, k, v (through a causal convolution and SiLU), z, b, a;
  q and k L2-normalized (q scaled by 1/sqrt(dk)), each k head shared by heads/k_heads value heads;
  beta = sigmoid(b), g = A * softplus(a + dt_bias) (A = -exp(A_log) < 0); the delta rule's output
  RMS-normalized per head, times norm weight and silu(z), then projected out;
- gated attention: q and a gate per head, q and k RMS-normalized per head, RoPE on the first
  `rope_dim` of each head (laid out full-width: engine/model/hybrid_weights.py), causal attention over the
  KV pool, times sigmoid(gate), projected out.

Each sequence's recurrent state travels with its KV rows (SequenceRows.states, engine/kvcache/recurrent.py):
prompt rows read from the sequence's mark (a chunk boundary) through the chunked form, whose state at
the last boundary reached becomes the new mark; decode rows take the recurrent form from `now`."""
from __future__ import annotations

import numpy as np

from engine.core.deferred import GatedSum
from engine.core.step import Step
from engine.kvcache.kv import SequenceRows
from engine.model.forward import LlamaModel
from engine.model.rope import frequencies


class HybridModel(LlamaModel):
    def __init__(self, cfg, weights, backend):
        super().__init__(cfg, weights, backend)
        h = cfg.hybrid
        # partial rotary: the first rope_dim / 2 frequencies, then zeros (cos 1, sin 0) to the head's half, the
        # Q and K heads' rows laid out for it (engine/model/hybrid_weights.py)
        inv_freq, self.rope_mscale = frequencies(h.rope_dim, cfg.rope_base, cfg.rope)
        self.inv_freq = np.concatenate([inv_freq, np.zeros(cfg.head_dim // 2 - len(inv_freq))])
        self.kv_layer = {i: n for n, i in enumerate(h.attention_layers)}  # layer -> its KV pool index
        self.state_layer = {i: n for n, i in enumerate(h.linear_layers)}  # layer -> its state index

    def forward_on_device(self, tokens, step: Step, kv: SequenceRows, want_logits: bool, between=None,
                          logit_rows: list[int] | None = None, hidden_rows: list[int] | None = None):
        ops, eps = self.ops, self.cfg.norm_eps
        ops.begin(step)
        x = ops.embed(self.w.tok_embd, tokens)  # (n, dim) fp32 residual stream
        cos, sin = self.rope_tables(0 if step.batch else max(start + n for start, n in step.spans_or_one()))
        states = ops.state_rows(step, kv.states) if self.state_layer else None  # the delta rule's view of them
        delta = None
        for i, layer in enumerate(self.w.layers):
            h = ops.add_rms_norm(x, delta, layer.attn_norm, eps)  # (n, dim)
            if i in self.state_layer:
                lw = layer.linear
                mixed = ops.delta_net(ops.matmul(h, lw.w_in), lw, self.cfg.hybrid, self.state_layer[i], states, eps)
                out = self.output(mixed, lw.w_out)  # (n, dim)
            else:
                out = self.gated_attention(h, layer, cos, sin, kv, self.kv_layer[i], step)
            h = ops.add_rms_norm(x, out, layer.ffn_norm, eps)
            delta = self.feed_forward(i, h, layer)
            if between is not None and i + 1 < len(self.w.layers):
                between(i)
                ops.begin(step)
        return self.final_logits(x, delta, step, want_logits, logit_rows, hidden_rows)

    def feed_forward(self, i: int, h, layer):
        """The routed experts plus the shared expert gated by sigmoid(h . its gate) (qwen3next, qwen35moe), or
        a dense SwiGLU (qwen35): a delta the next norm takes (a GatedSum, a Projection)."""
        ops = self.ops
        act = ops.gate_up_act(h, layer.w_gate_up)  # (n, ffn)
        if layer.experts is None:
            return self.output(act, layer.w_down)  # (n, dim), taken at the next norm
        return GatedSum(self.mixture(i, h, layer), ops.matmul(act, layer.w_down), ops.rows(h), layer.shared_gate)

    def gated_attention(self, h, layer, cos, sin, kv: SequenceRows, j: int, step: Step):
        """h: (n, dim) -> (n, dim) (a Projection): attention as Qwen3's (per-head Q/K norms, RoPE laid out full-width:
        engine/model/hybrid_weights.py) times sigmoid(gate) per value, projected out."""
        ops = self.ops
        norms = (layer.q_norm, layer.k_norm, self.cfg.norm_eps)
        q = ops.rope_store(ops.matmul(h, layer.wqkv), cos, sin, kv.k[j], kv.v[j], step, norms)  # (n, heads, d)
        attn = ops.attention(q, kv.k[j], kv.v[j], step)  # (n, heads * d)
        return self.output(ops.sigmoid_mul(attn, ops.matmul(h, layer.w_gate)), layer.wo)  # taken at the next norm
