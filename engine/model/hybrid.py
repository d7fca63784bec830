"""The forward pass of the hybrid linear-attention families (qwen3next, qwen35, qwen35moe): Gated
DeltaNet layers (engine/ops/delta_rule.py) with, every `full_attention_interval` layers, a gated
full-attention layer; a routed mixture of experts with a shared expert (or a dense feed-forward).

Per layer: x += mixer(norm(x)); x += ffn(norm(x)), where the mixer is one of
- Gated DeltaNet: one projection gives q, k, v (through a causal convolution and SiLU), z, b, a;
  q and k L2-normalized (q scaled by 1/sqrt(dk)), each k head shared by heads/k_heads value heads;
  beta = sigmoid(b), g = A * softplus(a + dt_bias) (A = -exp(A_log) < 0); the delta rule's output
  RMS-normalized per head, times norm weight and silu(z), then projected out;
- gated attention: q and a gate per head, q and k RMS-normalized per head, RoPE on the first
  `rope_dim` of each head, causal attention over the KV pool, times sigmoid(gate), projected out.

Each sequence's recurrent state travels with its KV rows (SequenceRows.states, engine/kvcache/recurrent.py):
prompt rows read from the sequence's mark (a chunk boundary) through the chunked form, whose state at
the last boundary reached becomes the new mark; decode rows take the recurrent form from `now`."""
from __future__ import annotations

import numpy as np

from engine.core.step import Step
from engine.kvcache.kv import SequenceRows
from engine.kvcache.recurrent import SequenceState
from engine.model.forward import LlamaModel
from engine.model.rope import frequencies
from engine.ops import delta_rule as dr

F32 = np.float32


def sigmoid(x):
    return F32(1.0) / (F32(1.0) + np.exp(-x))


def softplus(x):
    """log(1 + exp(x)), exact for large x as torch's (threshold 20)."""
    return np.where(x > 20, x, np.log1p(np.exp(np.minimum(x, 20)))).astype(F32)


class HybridModel(LlamaModel):
    def __init__(self, cfg, weights, backend):
        super().__init__(cfg, weights, backend)
        h = cfg.hybrid
        self.inv_freq, self.rope_mscale = frequencies(h.rope_dim, cfg.rope_base, cfg.rope)  # partial rotary
        self.kv_layer = {i: n for n, i in enumerate(h.attention_layers)}  # layer -> its KV pool index
        self.state_layer = {i: n for n, i in enumerate(h.linear_layers)}  # layer -> its state index

    def forward_on_device(self, tokens, step: Step, kv: SequenceRows, want_logits: bool, between=None,
                          logit_rows: list[int] | None = None, hidden_rows: list[int] | None = None):
        ops, eps = self.ops, self.cfg.norm_eps
        ops.begin(step)
        x = ops.embed(self.w.tok_embd, tokens)  # (n, dim) fp32 residual stream
        cos, sin = self.rope_tables(0 if step.batch else max(start + n for start, n in step.spans_or_one()))
        delta = None
        for i, layer in enumerate(self.w.layers):
            h = ops.add_rms_norm(x, delta, layer.attn_norm, eps)  # (n, dim)
            if i in self.state_layer:
                out = self.delta_net(self.state_layer[i], h, layer.linear, step, kv.states)
            else:
                j = self.kv_layer[i]
                out = self.gated_attention(h, layer, cos, sin, kv.k[j], kv.v[j], step)
            h = ops.add_rms_norm(x, out, layer.ffn_norm, eps)
            delta = self.feed_forward(i, h, layer)
            if between is not None and i + 1 < len(self.w.layers):
                between(i)
                ops.begin(step)
        return self.final_logits(x, delta, step, want_logits, logit_rows, hidden_rows)

    def feed_forward(self, i: int, h, layer):
        """The routed experts plus the shared expert gated by sigmoid(its gate) (qwen3next, qwen35moe), or
        a dense SwiGLU (qwen35)."""
        ops = self.ops
        if layer.experts is None:
            return ops.matmul(ops.silu_mul(ops.matmul(h, layer.w_gate_up)), layer.w_down)
        delta = self.mixture(i, h, layer)  # (n, dim)
        shared = ops.matmul(ops.silu_mul(ops.matmul(h, layer.w_gate_up)), layer.w_down)  # (n, dim)
        gate = sigmoid(ops.matmul(h, layer.shared_gate))  # (n, 1)
        return delta + shared * gate

    # ------------------------------------------------------------ gated full attention

    def gated_attention(self, h, layer, cos, sin, k_cache, v_cache, step: Step):
        """h: (n, dim) -> (n, dim). layer.wqkv's rows: [q (heads*d) | gate (heads*d) | k (kv*d) | v (kv*d)]."""
        ops, cfg = self.ops, self.cfg
        n, d, heads, kv_heads = len(h), cfg.head_dim, cfg.n_heads, cfg.n_kv_heads
        qgkv = ops.matmul(h, layer.wqkv)
        q, gate, k, v = np.split(qgkv, np.cumsum([heads * d, heads * d, kv_heads * d]), axis=1)
        q = head_norm(q.reshape(n, heads, d), layer.q_norm, cfg.norm_eps)
        k = head_norm(k.reshape(n, kv_heads, d), layer.k_norm, cfg.norm_eps)
        at = step.row_positions()
        q, k = (partial_rope(t, cos[at], sin[at]) for t in (q, k))
        ops.store_rows(k, v.reshape(n, kv_heads, d), k_cache, v_cache, step)
        attn = ops.attention(q, k_cache, v_cache, step)  # (n, heads*d)
        return ops.matmul(attn * sigmoid(gate), layer.wo)

    # ------------------------------------------------------------ Gated DeltaNet

    def delta_net(self, j: int, h, lw, step: Step, states: tuple[SequenceState, ...]):
        """State layer j's mixer over the step's rows: h (n, dim) -> (n, dim)."""
        hy, n = self.cfg.hybrid, len(h)
        nv, dv = hy.v_heads, hy.dv
        proj = self.ops.matmul(h, lw.w_in)  # (n, channels + nv*dv + 2*nv): [q | k | v | z | b | a]
        mixed, z, b, a = np.split(proj, np.cumsum([hy.channels, nv * dv, nv]), axis=1)
        beta = sigmoid(b)  # (n, nv)
        g = lw.a * softplus(a + lw.dt_bias)  # (n, nv) log decays, <= 0
        out = np.empty((n, nv, dv), F32)
        if step.batch or step.decode:  # decode rows: each its sequence's next position, recurrent
            for r, state in enumerate(states):
                conv, state.now.conv[j] = dr.causal_conv(mixed[r : r + 1], state.now.conv[j], lw.conv)
                q, k, v = self.heads(conv)
                out[r] = dr.step(state.now.ssm[j], q[0], k[0], v[0], g[r], beta[r])
        else:  # prompt rows of each sequence, from its mark to its last chunk boundary, then the rest
            for (start, count), (lo, hi), state in zip(step.spans_or_one(), step.row_ranges(), states):
                whole = state.next_mark(start, count) - start  # the rows up to the read's last chunk boundary
                for a0, a1 in ((lo, lo + whole), (lo + whole, hi)):
                    if a1 > a0:
                        conv, state.now.conv[j] = dr.causal_conv(mixed[a0:a1], state.now.conv[j], lw.conv)
                        q, k, v = self.heads(conv)
                        out[a0:a1] = dr.read(state.now.ssm[j], q, k, v, g[a0:a1], beta[a0:a1])
                    if a0 == lo and whole:  # the last boundary reached: the next read starts there
                        state.mark.conv[j], state.mark.ssm[j] = state.now.conv[j], state.now.ssm[j]
        z = z.reshape(n, nv, dv)
        normed = head_norm(out, lw.norm, self.cfg.norm_eps) * (z * sigmoid(z))  # the gated norm
        return self.ops.matmul(normed.reshape(n, nv * dv).astype(F32), lw.w_out)

    def heads(self, conv):
        """The convolution's output (n, channels) -> q (n, nv, dk) normalized and scaled, k (n, nv, dk)
        normalized (each k head given to its value heads: HybridConfig.tiled), v (n, nv, dv)."""
        hy, n = self.cfg.hybrid, len(conv)
        q, k, v = np.split(conv, np.cumsum([hy.k_heads * hy.dk, hy.k_heads * hy.dk]), axis=1)
        q = dr.l2_normalize(q.reshape(n, hy.k_heads, hy.dk), hy.l2_eps) * F32(hy.dk ** -0.5)
        k = dr.l2_normalize(k.reshape(n, hy.k_heads, hy.dk), hy.l2_eps)
        repeat = hy.v_heads // hy.k_heads
        spread = (lambda x: np.tile(x, (1, repeat, 1))) if hy.tiled else (lambda x: np.repeat(x, repeat, axis=1))
        return spread(q), spread(k), v.reshape(n, hy.v_heads, hy.dv)


def head_norm(x, weight, eps: float):
    """x (n, heads, d) RMS-normalized over d, times weight (d,)."""
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + F32(eps)) * weight


def partial_rope(x, cos, sin):
    """x (n, heads, d): its first 2*half values rotated (NEOX halves), the rest as they are; cos/sin (n, 1, half)."""
    half = cos.shape[-1]
    x1, x2 = x[..., :half], x[..., half : 2 * half]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin, x[..., 2 * half :]], axis=-1)
