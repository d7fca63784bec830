"""The gated delta rule of linear-attention layers (Qwen3-Next's and Qwen3.5's Gated DeltaNet), in
float32 NumPy: the reference the GPU kernels are checked against.

Per value head, with a state S (dk, dv), each position t (q_t, k_t L2-normalized, q_t scaled by
1/sqrt(dk); beta_t in (0, 1); g_t <= 0 a log decay):

    S <- S * exp(g_t)
    S <- S + k_t (beta_t (v_t - S^T k_t))^T
    o_t = S^T q_t

A prompt's positions go through the chunked form (`read`): chunks of CHUNK positions at absolute
multiples of CHUNK, the last one padded with zeros (beta = g = 0 leaves S and the real rows alone), so
that every product has the same shape whatever the read's length. A position's output is then the
same bits whether its chunk is whole or cut short, and the state at a chunk's start is all a later
read needs (engine/kvcache/recurrent.py keeps it). Decode rows take the recurrent form (`step`).
Both are the same function of the inputs; their last bits differ (the chunked form's intra-chunk
solve), which is why a read never continues from a state the recurrent form made.
"""
from __future__ import annotations

import numpy as np

from engine.core.chunks import DELTA_CHUNK as CHUNK  # positions of one chunk of the chunked form (a KV block's size)
F32 = np.float32


def l2_normalize(x: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """x (..., d) / sqrt(sum(x^2) + eps), as the references normalize q and k."""
    return x / np.sqrt(np.sum(x * x, axis=-1, keepdims=True) + F32(eps))


def causal_conv(x: np.ndarray, window: np.ndarray, weight: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A depthwise causal convolution and SiLU. x: (n, channels) new inputs; window: (kernel-1, channels)
    the inputs before them (zeros at a sequence's start); weight: (channels, kernel). Returns (silu(conv)
    (n, channels), the last kernel-1 inputs (kernel-1, channels)). Each output is its kernel's products
    summed in the same order, whatever n."""
    kernel = weight.shape[1]
    padded = np.concatenate([window, x])  # (kernel-1+n, channels)
    n = len(x)
    out = padded[0:n] * weight[:, 0]
    for i in range(1, kernel):
        out += padded[i : i + n] * weight[:, i]
    return out / (F32(1.0) + np.exp(-out)), padded[n:].copy()


def step(state: np.ndarray, q: np.ndarray, k: np.ndarray, v: np.ndarray, g: np.ndarray, beta: np.ndarray) -> np.ndarray:
    """One position of one sequence, the recurrent form. state: (heads, dk, dv) updated in place;
    q, k: (heads, dk) normalized, q scaled; v: (heads, dv); g, beta: (heads,). Returns o (heads, dv)."""
    state *= np.exp(g)[:, None, None]
    remembered = np.einsum("hkv,hk->hv", state, k)  # (heads, dv)
    delta = (v - remembered) * beta[:, None]
    state += k[:, :, None] * delta[:, None, :]
    return np.einsum("hkv,hk->hv", state, q)


def read(state: np.ndarray, q: np.ndarray, k: np.ndarray, v: np.ndarray, g: np.ndarray, beta: np.ndarray) -> np.ndarray:
    """Positions start.. of one sequence from its state at `start`, a multiple of CHUNK (n positions,
    the chunked form). state: (heads, dk, dv) updated in place to the state after the last position;
    q, k: (n, heads, dk); v: (n, heads, dv); g, beta: (n, heads). Returns o (n, heads, dv)."""
    n = len(q)
    out = np.empty(v.shape, dtype=F32)
    for lo in range(0, n, CHUNK):
        hi = min(n, lo + CHUNK)
        out[lo:hi] = chunk(state, *(padded(x[lo:hi]) for x in (q, k, v, g, beta)))[: hi - lo]
    return out


def padded(x: np.ndarray) -> np.ndarray:
    """A chunk's rows (m, ...) padded with zeros to CHUNK rows."""
    if len(x) == CHUNK:
        return x
    out = np.zeros((CHUNK, *x.shape[1:]), dtype=x.dtype)
    out[: len(x)] = x
    return out


LOWER = np.tril(np.ones((CHUNK, CHUNK), dtype=bool))  # j <= i
STRICT = np.tril(np.ones((CHUNK, CHUNK), dtype=bool), -1)  # j < i


def chunk(state: np.ndarray, q, k, v, g, beta) -> np.ndarray:
    """One chunk of CHUNK positions (padding included) from `state` (heads, dk, dv), which becomes the
    state after it. The WY form: the chunk's updates solved as one lower-triangular system, then
    applied to the outputs and the state by matrix products. Returns o (CHUNK, heads, dv)."""
    q, k, v = (x.transpose(1, 0, 2) for x in (q, k, v))  # (heads, C, d)
    g, beta = g.T, beta.T  # (heads, C)
    decay = np.cumsum(g, axis=-1)  # (heads, C): log decay from the chunk's start to each position
    gaps = np.exp(np.where(LOWER, decay[:, :, None] - decay[:, None, :], -np.inf)).astype(F32)  # (heads, C, C)
    k_beta, v_beta = k * beta[:, :, None], v * beta[:, :, None]
    # T = (I + strictly_lower(diag(beta) K K^T * gaps))^-1, by forward substitution row by row
    t = np.where(STRICT, -(k_beta @ k.transpose(0, 2, 1)) * gaps, F32(0))  # (heads, C, C)
    for i in range(1, CHUNK):
        t[:, i, :i] += np.sum(t[:, i, :i, None] * t[:, :i, :i], axis=-2)
    t[:, np.arange(CHUNK), np.arange(CHUNK)] = 1
    values = t @ v_beta  # (heads, C, dv)
    k_decayed = t @ (k_beta * np.exp(decay)[:, :, None])  # (heads, C, dk)
    new_values = values - k_decayed @ state  # (heads, C, dv): what the state does not already hold
    inner = np.where(LOWER, (q @ k.transpose(0, 2, 1)) * gaps, F32(0))  # (heads, C, C)
    out = (q * np.exp(decay)[:, :, None]) @ state + inner @ new_values  # (heads, C, dv)
    last = decay[:, -1]  # (heads,)
    state *= np.exp(last)[:, None, None]
    state += (k * np.exp(last[:, None] - decay)[:, :, None]).transpose(0, 2, 1) @ new_values
    return out.transpose(1, 0, 2)
