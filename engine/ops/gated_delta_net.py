"""A Gated DeltaNet layer's mixer (Qwen3-Next's and Qwen3.5's linear attention) in float32 NumPy, from its
in-projection's rows to the gated norm's output: the CPU's path and the reference the GPU's kernels
(engine/kernels/linear_attention.cu) are checked against.

Per row, the in-projection gives [q | k | v | z | b | a] (engine/model/hybrid_weights.py): q, k and v go
through the causal convolution and SiLU, q and k are L2-normalized per k head (q scaled by 1/sqrt(dk)) and
each k head is given to its value heads (HybridConfig.tiled says how); beta = sigmoid(b) and g = A *
softplus(a + dt_bias) (A = -exp(A_log) < 0) drive the delta rule (engine/ops/delta_rule.py); its output is
RMS-normalized per value head, times the norm's weight and silu(z)."""
from __future__ import annotations

import numpy as np

from engine.core.step import Step
from engine.ops import delta_rule as dr

F32 = np.float32


def sigmoid(x):
    return F32(1.0) / (F32(1.0) + np.exp(-x))


def softplus(x):
    """log(1 + exp(x)), exact for large x as torch's (threshold 20)."""
    return np.where(x > 20, x, np.log1p(np.exp(np.minimum(x, 20)))).astype(F32)


def head_norm(x, weight, eps: float):
    """x (n, heads, d) RMS-normalized over d, times weight (d,)."""
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + F32(eps)) * weight


def mixer(proj: np.ndarray, lw, hy, j: int, step: Step, states, eps: float) -> np.ndarray:
    """State layer j's mixer over the step's rows: proj (n, channels + nv*dv + 2*nv), the in-projection's
    output -> (n, nv*dv) float32, the input of the out-projection. lw: the layer's LinearAttentionWeights; hy:
    the HybridConfig; states: each sequence's SequenceState (engine/kvcache/recurrent.py), advanced here.
    Decode rows take the recurrent form from each state's `now`; prompt rows the chunked form from its
    mark (a chunk boundary) to the read's last boundary, where the mark moves, then the rest."""
    n, nv, dv = len(proj), hy.v_heads, hy.dv
    mixed, z, b, a = np.split(proj, np.cumsum([hy.channels, nv * dv, nv]), axis=1)
    beta = sigmoid(b)  # (n, nv)
    g = lw.a * softplus(a + lw.dt_bias)  # (n, nv) log decays, <= 0
    out = np.empty((n, nv, dv), F32)
    if step.batch or step.decode:  # decode rows: each its sequence's next position, recurrent
        for r, state in enumerate(states):
            conv, state.now.conv[j] = dr.causal_conv(mixed[r : r + 1], state.now.conv[j], lw.conv)
            q, k, v = heads(conv, hy)
            out[r] = dr.step(state.now.ssm[j], q[0], k[0], v[0], g[r], beta[r])
    else:  # prompt rows of each sequence, from its mark to its last chunk boundary, then the rest
        for (start, count), (lo, hi), state in zip(step.spans_or_one(), step.row_ranges(), states):
            whole = state.next_mark(start, count) - start  # the rows up to the read's last chunk boundary
            for a0, a1 in ((lo, lo + whole), (lo + whole, hi)):
                if a1 > a0:
                    conv, state.now.conv[j] = dr.causal_conv(mixed[a0:a1], state.now.conv[j], lw.conv)
                    q, k, v = heads(conv, hy)
                    out[a0:a1] = dr.read(state.now.ssm[j], q, k, v, g[a0:a1], beta[a0:a1])
                if a0 == lo and whole:  # the last boundary reached: the next read starts there
                    state.mark.conv[j], state.mark.ssm[j] = state.now.conv[j], state.now.ssm[j]
    z = z.reshape(n, nv, dv)
    normed = head_norm(out, lw.norm, eps) * (z * sigmoid(z))  # the gated norm
    return normed.reshape(n, nv * dv).astype(F32)


def heads(conv, hy):
    """The convolution's output (n, channels) -> q (n, nv, dk) normalized and scaled, k (n, nv, dk)
    normalized (each k head given to its value heads: HybridConfig.tiled), v (n, nv, dv)."""
    n = len(conv)
    q, k, v = np.split(conv, np.cumsum([hy.k_heads * hy.dk, hy.k_heads * hy.dk]), axis=1)
    q = dr.l2_normalize(q.reshape(n, hy.k_heads, hy.dk), hy.l2_eps) * F32(hy.dk ** -0.5)
    k = dr.l2_normalize(k.reshape(n, hy.k_heads, hy.dk), hy.l2_eps)
    repeat = hy.v_heads // hy.k_heads
    spread = (lambda x: np.tile(x, (1, repeat, 1))) if hy.tiled else (lambda x: np.repeat(x, repeat, axis=1))
    return spread(q), spread(k), v.reshape(n, hy.v_heads, hy.dv)
