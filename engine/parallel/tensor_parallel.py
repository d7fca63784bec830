"""Tensor parallelism as Megatron splits a Llama layer: each of `world` ranks holds 1/world of the
query and K/V heads and of the feed-forward's hidden units, so a layer's two output projections
give partial sums that one all-reduce per projection adds up.

    wqkv, w_gate_up   rows split (column parallel): rank r computes its heads' Q/K/V and its
                      slice of the hidden units; RoPE, attention and SwiGLU run on them alone
    wo, w_down        columns split (row parallel): each rank's product is a partial (n, dim),
                      summed over the ranks before the residual add
    embeddings, norms, the head: whole on every rank (the residual stream is the same everywhere)

Each rank is a LlamaModel over a shard's config and weights with `reduce` set (engine/model/forward.py
calls it on both partials) and its own KV cache of its K/V heads. `ThreadGroup` runs the ranks of
one process in threads and adds their partials in rank order, the same sum on every rank: the CPU
and one-GPU check of the split against the whole model (tests/engine/parallel/test_tensor_parallel.py).
Across processes (engine/parallel/tp_workers.py, `strata --tp N`) the same hook sends the partials over
pipes; across GPUs it would be an NCCL all-reduce, one process per GPU (issue 26: not yet run)."""
from __future__ import annotations

import threading
from dataclasses import replace

import numpy as np

from engine.ops.backend import Backend
from engine.modelfile.model_config import ModelConfig, ModelLoadError
from engine.model.weights import Weights, reserve_expansion, shard_config, shard_range
from engine.kvcache.kv import KVCache
from engine.core.kv_types import array_module
from engine.model.forward import LlamaModel
from engine.core.quantized import QuantMatrix, concat_rows


def rows(a, start: int, stop: int):
    """Rows of a weight: an array (host or device) or a QuantMatrix of GGUF blocks."""
    return a.row_range(start, stop) if isinstance(a, QuantMatrix) else a[start:stop]


def cols(a, start: int, stop: int):
    """Columns of a weight, contiguous (a QuantMatrix: whole blocks)."""
    return a.col_range(start, stop) if isinstance(a, QuantMatrix) else array_module(a).ascontiguousarray(a[:, start:stop])


def stacked(pieces: list):
    return concat_rows(pieces) if isinstance(pieces[0], QuantMatrix) else array_module(pieces[0]).concatenate(pieces)


def shard_weights(cfg: ModelConfig, weights: Weights, rank: int, world: int) -> Weights:
    """Rank `rank`'s weights, (out, in) as every weight here: float32 or fp16 arrays, or QuantMatrix
    blocks (whose column split must fall on block boundaries): its heads' rows of wqkv (and bqkv),
    its hidden units' rows of w_gate_up and columns of w_down, its heads' columns of wo; the rest
    shared (the same arrays, not copies)."""
    q_dim, kv_dim, ffn = cfg.q_dim, cfg.kv_dim, cfg.ffn_dim
    (q0, q1), (kv0, kv1), (f0, f1) = (shard_range(n, (rank, world)) for n in (q_dim, kv_dim, ffn))

    def qkv_rows(a):  # (q_dim + 2 kv_dim, ...) -> this rank's Q rows, K rows, V rows
        k, v = q_dim, q_dim + kv_dim
        return stacked([rows(a, q0, q1), rows(a, k + kv0, k + kv1), rows(a, v + kv0, v + kv1)])

    def hidden_rows(a):  # (2 ffn, dim): this rank's gate rows, then its up rows
        return stacked([rows(a, f0, f1), rows(a, ffn + f0, ffn + f1)])

    layers = []
    for layer in weights.layers:
        try:
            layers.append(replace(
                layer, wqkv=qkv_rows(layer.wqkv), bqkv=None if layer.bqkv is None else qkv_rows(layer.bqkv),
                wo=cols(layer.wo, q0, q1), w_gate_up=hidden_rows(layer.w_gate_up), w_down=cols(layer.w_down, f0, f1)))
        except ValueError as e:
            raise ModelLoadError(f"tensor parallel over {world}: {e}") from None
    return replace(weights, layers=layers)


def rank_sum(parts: list):
    """An all-reduce's total: the ranks' partials added in rank order, in fp32 whatever their type (an
    fp16 partial is rounded once, when the total is cast back, not at every addition), returned in
    the partials' type. Every group (ThreadGroup, engine/parallel/tp_workers.py's ProcessGroup) sums with it."""
    total = parts[0].astype("float32")  # a copy, even when the parts are fp32 already
    for p in parts[1:]:
        total += p
    return total.astype(parts[0].dtype, copy=False)


class ThreadGroup:
    """An all-reduce among `world` threads of one process: each rank hands its partial and gets
    the sum over the ranks, added in rank order (every rank's result is the same array's values)."""

    def __init__(self, world: int):
        self.world = world
        self.parts: list = [None] * world
        self.total = None
        self.barrier = threading.Barrier(world)

    def all_reduce(self, rank: int, part):
        self.parts[rank] = part
        if self.barrier.wait() == 0:  # one thread adds, in rank order
            self.total = rank_sum(self.parts)
        self.barrier.wait()
        total = self.total
        self.barrier.wait()  # nobody starts the next reduction before all have read this one
        return total


class TensorParallelModel:
    """`world` ranks of a model in one process, one thread each per forward; the interface of
    LlamaModel.forward over a list of per-rank caches (make_caches). Logits are rank 0's (every
    rank computes the same). backends: one per rank; on a GPU each rank needs its own (a backend's
    kernels keep state between the launches of one operation), all on the device the weights are on."""

    def __init__(self, cfg: ModelConfig, weights: Weights, backends: list[Backend]):
        world = len(backends)
        if world > 1 and backends[0].name == "gpu" and len({id(b) for b in backends}) < world:
            raise ValueError("tensor parallel on a GPU: one backend per rank")
        self.cfg, self.world, self.backends = shard_config(cfg, world), world, backends
        self.group = ThreadGroup(world)
        self.ranks = []
        for r, backend in enumerate(backends):
            shard = shard_weights(cfg, weights, r, world)
            reserve_expansion(backend, shard.layers)  # each rank's backend expands its own shard's matrices
            model = LlamaModel(self.cfg, shard, backend)
            model.reduce = lambda part, r=r: self.group.all_reduce(r, part)
            self.ranks.append(model)

    def make_caches(self, ctx: int) -> list[KVCache]:
        return [KVCache(self.cfg, ctx, backend) for backend in self.backends]

    def forward(self, tokens: np.ndarray, start: int, caches: list[KVCache], want_logits: bool):
        results: list = [None] * self.world
        errors: list[BaseException] = []
        if self.group.barrier.broken:  # an earlier forward failed part-way
            self.group.barrier.reset()

        def run(r: int) -> None:
            try:
                results[r] = self.ranks[r].forward(tokens, start, caches[r], want_logits)
            except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread
                errors.append(e)
                self.group.barrier.abort()  # the others stop waiting for this rank

        threads = [threading.Thread(target=run, args=(r,), name=f"tp-rank-{r}") for r in range(self.world)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise next((e for e in errors if not isinstance(e, threading.BrokenBarrierError)), errors[0])
        return results[0]
