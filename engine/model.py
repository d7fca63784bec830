"""The Llama forward pass over a chunk of positions against the KV cache, written once for xp."""
from __future__ import annotations

import numpy as np

from engine.backend import Backend
from engine.gguf_model import ModelConfig, Weights
from engine.kv import KVCache
from engine.prefill import chunk_end

KEY_TILE = 2048  # keys per attention tile: scores never exceed (kv_heads, group*n, KEY_TILE)


class LlamaModel:
    def __init__(self, cfg: ModelConfig, weights: Weights, backend: Backend):
        self.cfg, self.w, self.backend, self.xp = cfg, weights, backend, backend.xp
        half = cfg.head_dim // 2
        self.inv_freq = 1.0 / (cfg.rope_base ** (np.arange(half, dtype=np.float64) * 2 / cfg.head_dim))
        self.scale = np.float32(1.0 / np.sqrt(cfg.head_dim))
        self.cos_table = self.sin_table = None  # (positions, 1, half) on the device, grown on demand

    def forward(self, tokens: np.ndarray, start: int, kv: KVCache, want_logits: bool):
        """tokens: (n,) at absolute positions [start, start+n). Writes their K/V rows.
        Returns logits (vocab,) float32 of the last position on the host, or None."""
        xp, c = self.xp, self.cfg
        x = self.w.tok_embd[self.xp.asarray(tokens)].astype(xp.float32)  # (n, dim)
        cos, sin = self.rope_tables(start, len(tokens))
        bias = self.causal_bias(len(tokens)) if len(tokens) > 1 else None  # shared by every layer
        end = start + len(tokens)
        for i, layer in enumerate(self.w.layers):
            h = self.rms_norm(x, layer.attn_norm)
            qkv = self.backend.matmul(h, layer.wqkv)  # (n, dim + 2*kv_dim)
            q = qkv[:, : c.dim].reshape(-1, c.n_heads, c.head_dim)  # (n, heads, head_dim)
            k = qkv[:, c.dim : c.dim + c.kv_dim].reshape(-1, c.n_kv_heads, c.head_dim)
            v = qkv[:, c.dim + c.kv_dim :].reshape(-1, c.n_kv_heads, c.head_dim)
            kv.k[i, :, start:end] = self.rope(k, cos, sin).transpose(1, 0, 2)  # (kv_heads, n, head_dim)
            kv.v[i, :, start:end] = v.transpose(1, 0, 2)
            attn = self.attention(self.rope(q, cos, sin), kv.k[i, :, :end], kv.v[i, :, :end], start, bias)
            x = x + self.backend.matmul(attn, layer.wo)
            x = x + self.feed_forward(self.rms_norm(x, layer.ffn_norm), layer)
        if not want_logits:
            return None
        last = self.rms_norm(x[-1:], self.w.out_norm)  # (1, dim)
        return self.backend.to_host(self.backend.matmul(last, self.w.head)[0])  # (vocab,)

    def prefill(self, tokens: np.ndarray, kv: KVCache, chunk: int):
        """Read a whole prompt from position 0 in absolute chunks, as the engine does; returns the
        logits (vocab,) of its last position."""
        start, logits = 0, None
        while start < len(tokens):
            end = chunk_end(start, len(tokens), chunk)
            logits = self.forward(tokens[start:end], start, kv, want_logits=end == len(tokens))
            start = end
        return logits

    def rms_norm(self, x, weight):
        return self.backend.ops.rms_norm(x, weight, self.cfg.norm_eps)

    def rope_tables(self, start: int, n: int):
        """cos, sin: (n, 1, half) for positions [start, start+n), sliced from tables computed once
        (not per token: that was host trigonometry and, on a GPU, two copies every step)."""
        if self.cos_table is None or start + n > len(self.cos_table):
            size = max(start + n, self.cfg.context_length)
            angles = np.outer(np.arange(size, dtype=np.float64), self.inv_freq)  # (size, half)
            self.cos_table = self.xp.asarray(np.cos(angles).astype(np.float32))[:, None, :]
            self.sin_table = self.xp.asarray(np.sin(angles).astype(np.float32))[:, None, :]
        return self.cos_table[start : start + n], self.sin_table[start : start + n]

    def rope(self, x, cos, sin):
        """x: (n, heads, head_dim) with each head laid out [evens, odds] (see deinterleave_heads)."""
        return self.backend.ops.rope(x, cos, sin)

    def attention(self, q, keys, values, start: int, bias):
        """q: (n, heads, d); keys/values: (kv_heads, start+n, d); bias: (n, n) causal mask of the
        chunk's own keys. Causal, GQA, online softmax over key tiles. Returns (n, heads*d)."""
        xp, c = self.xp, self.cfg
        n, group = q.shape[0], c.n_heads // c.n_kv_heads
        # heads h = kv*group + g share kv head `kv`: (kv_heads, group*n, d), rows ordered (g, i)
        qg = q.reshape(n, c.n_kv_heads, group, c.head_dim).transpose(1, 2, 0, 3)
        qg = (qg * self.scale).reshape(c.n_kv_heads, group * n, c.head_dim)
        total = keys.shape[1]
        best = acc = norm = None
        for t0 in range(0, total, KEY_TILE):
            t1 = min(t0 + KEY_TILE, total)
            s = qg @ keys[:, t0:t1].transpose(0, 2, 1)  # (kv_heads, group*n, tile)
            if t1 > start + 1:  # tile reaches the diagonal: mask keys after each query
                lo = max(start, t0)  # keys of the chunk itself start here; earlier keys are all visible
                part = s.reshape(c.n_kv_heads, group, n, t1 - t0)[..., lo - t0 :]
                xp.add(part, bias[:, lo - start : t1 - start], out=part)
            tile_max = s.max(axis=-1, keepdims=True)
            new_best = tile_max if best is None else xp.maximum(best, tile_max)
            xp.subtract(s, new_best, out=s)
            p = xp.exp(s, out=s)  # unnormalized probabilities, in place
            if best is None:
                acc, norm = p @ values[:, t0:t1], p.sum(axis=-1, keepdims=True)
            else:
                corr = xp.exp(best - new_best)
                acc = acc * corr + p @ values[:, t0:t1]
                norm = norm * corr + p.sum(axis=-1, keepdims=True)
            best = new_best
        out = (acc / norm).reshape(c.n_kv_heads, group, n, c.head_dim)  # (kv, g, n, d)
        return out.transpose(2, 0, 1, 3).reshape(n, c.n_heads * c.head_dim)

    def causal_bias(self, n: int):
        """(n, n) float32 over the chunk's own keys: 0 where key <= query, -inf after it."""
        return self.xp.asarray(np.triu(np.full((n, n), -np.inf, dtype=np.float32), k=1))

    def feed_forward(self, h, layer):
        gate_up = self.backend.matmul(h, layer.w_gate_up)  # (n, 2*ffn_dim)
        gate, up = gate_up[:, : self.cfg.ffn_dim], gate_up[:, self.cfg.ffn_dim :]
        return self.backend.matmul(self.backend.ops.silu_mul(gate, up), layer.w_down)
