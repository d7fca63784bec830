"""The forward pass of the Llama family and its relatives (Qwen2, Qwen3, Qwen3-MoE) over a chunk of
positions against the KV cache, written once over the backend's operations (float32 NumPy on a
CPU, half precision kernels on a GPU). What differs between families is in ModelConfig and the
layer's weights: Q/K/V biases, per-head Q/K norms, routed experts in place of the feed-forward."""
from __future__ import annotations

from typing import Callable

import numpy as np

from engine.ops.backend import Backend
from engine.core.deferred import Projection, rows_of
from engine.core.step import Step
from engine.modelfile.model_config import ModelConfig
from engine.model.layer_weights import Weights
from engine.kvcache.kv import KVCache, SequenceRows
from engine.core.chunks import chunk_end
from engine.model.rope import frequencies


class LlamaModel:
    def __init__(self, cfg: ModelConfig, weights: Weights, backend: Backend):
        self.cfg, self.w, self.backend, self.ops = cfg, weights, backend, backend.ops
        self.inv_freq, self.rope_mscale = frequencies(cfg.head_dim, cfg.rope_base, cfg.rope)  # (half,), magnitude
        self.cos_table = self.sin_table = None  # (positions, 1, half) on the device, grown on demand
        self.route_log: list | None = None  # (layer, experts (n, k), weights (n, k)) per MoE layer, when a list
        self.reduce: Callable | None = None  # tensor parallel (engine/parallel/tensor_parallel.py): the output projections'
        # partial sums (n, dim) -> their sum over the ranks

    def forward(self, tokens: np.ndarray, start: int, kv: KVCache | SequenceRows, want_logits: bool,
                on_device: bool = False, between: Callable[[int], None] | None = None,
                hidden_rows: list[int] | None = None):
        """tokens: (n,) at absolute positions [start, start+n) of one sequence, whose K/V rows `kv`
        holds (KVCache.rows(its block table); a KVCache alone: its one sequence). Writes their K/V
        rows. Returns logits (vocab,) float32 of
        the last position on the host (or left on the device), or None. `between(i)` is called after
        each layer i but the last: the engine runs the other requests' decode steps there (they
        touch neither this forward's activations nor its rows, so its result does not change).
        With hidden_rows (rows of the n, for embeddings): (logits, their normed hidden states (len(hidden_rows),
        dim) float32 on the device) (final_logits)."""
        rows = kv.as_rows() if isinstance(kv, KVCache) else kv
        step = self.ops.step(len(tokens), start, rows.tables[0])
        out = self.forward_on_device(tokens, step, rows, want_logits, between, hidden_rows=hidden_rows)
        logits, hidden = out if hidden_rows is not None else (out, None)
        logits = logits if logits is None or on_device else self.backend.to_host(logits)
        return logits if hidden_rows is None else (logits, hidden)

    def forward_reads(self, reads, kv: KVCache, between: Callable[[int], None] | None = None, states: tuple = (),
                      hidden_rows: list[int] | None = None):
        """Prompt rows of several sequences in one pass (a shape-free backend's step: each row's
        result is what it would be alone): reads[i] = (tokens (n_i,), start_i, block table_i,
        want_logits_i). Writes their K/V rows (and advances their recurrent `states`, a hybrid's).
        Returns logits (wanted, vocab) float32 on the device, one row per read that wants them, in order
        (None if none does); with hidden_rows (rows of the step, the reads' rows one after another: for
        embeddings), (those logits, the rows' normed hidden states (len(hidden_rows), dim) float32)."""
        rows = kv.rows(*(table for _, _, table, _ in reads), states=states)
        step = self.ops.reads_step(tuple((start, len(tokens)) for tokens, start, _, _ in reads), rows.tables)
        ends = np.cumsum([len(tokens) for tokens, _, _, _ in reads]) - 1
        wanted = [int(end) for end, (*_, want) in zip(ends, reads) if want]
        tokens = np.concatenate([np.asarray(t, dtype=np.int64) for t, _, _, _ in reads])
        return self.forward_on_device(tokens, step, rows, bool(wanted), between, logit_rows=wanted,
                                      hidden_rows=hidden_rows)

    def forward_batch(self, tokens, tables, positions, kv: KVCache, states: tuple = ()):
        """A decode step of several sequences at once: tokens (n,), row i the next token of the
        sequence whose block table is tables[i] (and recurrent state states[i], a hybrid's), at
        positions[i]. One pass over the weights for all of them, attention over each one's own rows.
        Returns logits (n, vocab) float32 on the device."""
        rows = kv.rows(*tables, states=states)
        step = self.ops.batch_step(rows.tables, tuple(positions))
        return self.forward_on_device(tokens, step, rows, True)

    def forward_on_device(self, tokens, step: Step, kv: SequenceRows, want_logits: bool,
                          between: Callable[[int], None] | None = None, logit_rows: list[int] | None = None,
                          hidden_rows: list[int] | None = None):
        """The forward pass proper; tokens may already be on the device and `step` may carry
        device-side positions (a captured decode graph). Returns device logits, (vocab,) for one
        sequence, (n, vocab) for a decode batch, (len(logit_rows), vocab) for those rows, or None
        (with hidden_rows, those and the rows' normed hidden states: final_logits)."""
        ops, eps = self.ops, self.cfg.norm_eps
        ops.begin(step)
        x = ops.embed(self.w.tok_embd, tokens)  # (n, dim) fp32 residual stream
        cos, sin = self.rope_tables(0 if step.batch else max(start + n for start, n in step.spans_or_one()))
        delta = None  # the previous layer's feed-forward output, added at the next norm
        for i, layer in enumerate(self.w.layers):
            h = ops.add_rms_norm(x, delta, layer.attn_norm, eps)  # (n, dim)
            qkv = ops.matmul(h, layer.wqkv)  # (n, (heads + 2*kv_heads) * d)
            if layer.bqkv is not None:
                qkv = (qkv + layer.bqkv).astype(qkv.dtype, copy=False)
            norms = None if layer.q_norm is None else (layer.q_norm, layer.k_norm, eps)  # qwen3: per-head RMSNorm
            q = ops.rope_store(qkv, cos, sin, kv.k[i], kv.v[i], step, norms)  # (n, heads, d)
            attn = ops.attention(q, kv.k[i], kv.v[i], step)  # (n, heads * d)
            h = ops.add_rms_norm(x, self.output(attn, layer.wo), layer.ffn_norm, eps)
            if layer.experts is not None:
                delta = self.mixture(i, h, layer)  # (n, dim)
            else:
                delta = self.output(ops.gate_up_act(h, layer.w_gate_up), layer.w_down)  # (n, dim)
            if between is not None and i + 1 < len(self.w.layers):
                between(i)
                ops.begin(step)  # a decode step in between began its own
        return self.final_logits(x, delta, step, want_logits, logit_rows, hidden_rows)

    def output(self, rows, w):
        """A layer's output projection rows (n, k) @ w^T as the next norm takes it: a Projection (a GPU's decode
        row then runs it in the norm's kernel), or under tensor parallelism the ranks' partial products summed."""
        if self.reduce is None:
            return Projection(rows, w)
        return self.reduce(self.ops.matmul(rows, w))

    def final_logits(self, x, delta, step: Step, want_logits: bool, logit_rows: list[int] | None,
                     hidden_rows: list[int] | None = None):
        """The last layer's output added, the final norm and the head over the rows wanted: (vocab,) for
        a sequence's last position, (n, vocab) for a decode batch, (len(logit_rows), vocab) for those
        rows; None if none is wanted. With hidden_rows (rows of the step; embeddings' pooling,
        engine/runner/pooling.py): (those logits, the final norm's output at those rows (len(hidden_rows),
        dim) float32: what the head would read there), each row as it would be in any step (row-local)."""
        ops, eps = self.ops, self.cfg.norm_eps
        if isinstance(delta, Projection) and (hidden_rows is not None or logit_rows is not None or step.n > 1):
            delta = ops.product(delta)  # (n, dim): rows of it are taken below (a lone decode row's stays whole)
        if hidden_rows is not None:  # first, from copies of its rows: the head's rows below may be a view of x
            # that the norm's residual add writes into
            at = self.backend.xp.asarray(np.asarray(hidden_rows, dtype=np.int64))
            hidden = ops.add_rms_norm(x[at], rows_of(delta, at), self.w.out_norm, eps)  # (len(hidden_rows), dim)
            return self.final_logits(x, delta, step, want_logits, logit_rows), hidden.astype(np.float32, copy=False)
        if not want_logits:
            return None
        if logit_rows is not None:  # the chosen rows (each read's last)
            rows = self.backend.xp.asarray(np.asarray(logit_rows, dtype=np.int64))
        else:  # every row of a batch, else the last position
            rows = slice(None) if step.batch else slice(-1, None)
        if isinstance(delta, Projection):  # a lone decode row's: x and its delta whole
            last = ops.add_rms_norm(x, delta, self.w.out_norm, eps)  # (1, dim)
        else:
            last = ops.add_rms_norm(x[rows], rows_of(delta, rows), self.w.out_norm, eps)  # (rows, dim)
        logits = ops.logits(last, self.w.head)  # (rows, vocab) float32
        return logits if step.batch or logit_rows is not None else logits[0]

    def mixture(self, i: int, h, layer):
        """Layer i's routed experts (engine/ops/moe.py); the routes are recorded when route_log is a list."""
        delta, chosen, weights = self.ops.mixture(h, layer.router, layer.experts, self.cfg.n_experts_used,
                                                  self.cfg.expert_weights_norm)
        if self.route_log is not None:
            self.route_log.append((i, self.backend.to_host(chosen), self.backend.to_host(weights)))
        return delta

    def prefill(self, tokens: np.ndarray, kv: KVCache, chunk: int):
        """Read a whole prompt from position 0 in absolute chunks, as the engine does; returns the
        logits (vocab,) of its last position."""
        start, logits = 0, None
        while start < len(tokens):
            end = chunk_end(start, len(tokens), chunk)
            logits = self.forward(tokens[start:end], start, kv, want_logits=end == len(tokens))
            start = end
        return logits

    def rope_tables(self, end: int):
        """cos, sin: (positions, 1, half) float32 tables covering [0, end), computed once (not
        per token: that was host trigonometry and, on a GPU, two copies a step); rope_store reads
        the rows of its positions. Rope scaling is in them (engine/model/rope.py): the frequencies, and
        YaRN's magnitude on both."""
        if self.cos_table is None or end > len(self.cos_table):
            size = max(end, min(self.cfg.max_context, 1 << 17))
            angles = np.outer(np.arange(size, dtype=np.float64), self.inv_freq)  # (size, half)
            scale = self.rope_mscale
            self.cos_table = self.backend.xp.asarray((np.cos(angles) * scale).astype(np.float32))[:, None, :]
            self.sin_table = self.backend.xp.asarray((np.sin(angles) * scale).astype(np.float32))[:, None, :]
        return self.cos_table, self.sin_table
