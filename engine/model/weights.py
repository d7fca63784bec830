"""GGUF -> the model's weights on a backend: dequantized, or kept in their quantized blocks on the GPU
(the file memory-mapped: engine/modelfile/gguf_file.py; its config: engine/modelfile/model_config.py)."""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass, replace

import numpy as np
from gguf import GGMLQuantizationType

from engine.core.quantized import BLOCKS, HostRows, QuantMatrix, row_bytes, stack_rows
from engine.kernels import DEQUANT  # the GGUF types the device expands itself (no CuPy import)
from engine.core.experts import Experts, ExpertStack
from engine.model.hybrid_weights import hybrid_layer
from engine.model.layer_weights import LayerWeights, Weights
from engine.model.dequant import dequantize, dequantize_into
from engine.ops.backend import Backend
from engine.ops.host_pages import plain_pages
from engine.model.expanded_cache import ExpandedCache
from engine.ops.expert_cache import ExpertCache
from engine.modelfile.gguf_file import GGUFFile
from engine.modelfile.model_config import ModelConfig, ModelLoadError, read_config
from engine.modelfile.rope_config import RopeOverride


def shard_range(n: int, shard: tuple[int, int]) -> tuple[int, int]:
    """Rank `rank`'s slice of n rows or columns split evenly over `world` ranks (shard = (rank, world)):
    its heads' rows of Q, K or V, its hidden units (engine/parallel/tensor_parallel.py)."""
    rank, world = shard
    return rank * n // world, (rank + 1) * n // world


def shard_config(cfg: ModelConfig, world: int) -> ModelConfig:
    """One rank's config: heads, K/V heads and the feed-forward's width divided by `world`."""
    if cfg.n_experts or cfg.hybrid:
        raise ModelLoadError(f"tensor parallel: {cfg.arch}'s routed experts or linear-attention layers are not split "
                             "(dense Llama-family layers only)")
    for what, n in (("query heads", cfg.n_heads), ("K/V heads", cfg.n_kv_heads), ("feed-forward width", cfg.ffn_dim)):
        if n % world:
            raise ModelLoadError(f"tensor parallel over {world}: the model's {n} {what} do not split evenly")
    return replace(cfg, n_heads=cfg.n_heads // world, n_kv_heads=cfg.n_kv_heads // world, ffn_dim=cfg.ffn_dim // world)


def deinterleave_heads(w, n_heads: int):
    """llama.cpp stores Q/K rows with RoPE pairs adjacent; reorder each head to [evens, odds]
    so RoPE rotates halves (contiguous slices). q.k is unchanged since q and k move alike."""
    rows, cols = w.shape
    d = rows // n_heads
    return w.reshape(n_heads, d // 2, 2, cols).transpose(0, 2, 1, 3).reshape(rows, cols)


class WeightLoader:
    """Weights from the memory-mapped file to the backend. On the GPU, quantized tensors stay in their
    blocks (QuantMatrix; `keep_blocks`) or are expanded to fp16 by a kernel (--weights fp16), F16
    tensors are copied as they are, BF16 ones expanded on the device: only the file's bytes cross
    the bus, and no float32 host copy of the model is made."""

    REPORT_EVERY_S = 2.0

    def __init__(self, reader: GGUFFile, cfg: ModelConfig, backend: Backend, keep_blocks: bool = True,
                 shard: tuple[int, int] | None = None, expert_slots: int | None = None):
        """shard: (rank, world) to load only that rank's part of each split weight (engine/parallel/tensor_parallel.py
        says which): the rest of the file's rows never reach the device. expert_slots: a MoE layer's routed experts
        stay in host memory (the file's pages) behind that many device slots (engine/ops/expert_cache.py)."""
        self.expert_slots = expert_slots
        self.tensors = {t.name: t for t in reader.tensors}
        self.cfg, self.backend, self.xp, self.shard = cfg, backend, backend.xp, shard
        self.keep_blocks = keep_blocks and backend.name == "gpu"
        self.total_bytes = sum(int(t.n_bytes) for t in reader.tensors)
        self.done_bytes, self.started = 0, time.monotonic()
        self.reported = self.started
        self.counted: set[str] = set()  # the tensors whose bytes progress() has counted
        self.expanded = ExpandedCache.from_env(reader.path, shard) if backend.name == "cpu" else None

    def tensor(self, name: str):
        if name not in self.tensors:
            raise ModelLoadError(f"missing tensor {name}")
        return self.tensors[name]

    def progress(self, t) -> None:
        if t.name in self.counted:  # a tensor whose rows went into two matrices (a gated attention's q and gate)
            return
        self.counted.add(t.name)
        self.done_bytes += int(t.n_bytes)
        now = time.monotonic()
        if now - self.reported >= self.REPORT_EVERY_S or self.done_bytes == self.total_bytes:
            self.reported = now
            print(f"strata: loading weights {self.done_bytes / 2**30:.2f}/{self.total_bytes / 2**30:.2f} GiB "
                  f"({now - self.started:.1f}s)", file=sys.stderr, flush=True)

    def part(self, n: int) -> tuple[int, int] | None:
        """This rank's range of n split rows or columns (None: no shard, all of them)."""
        return None if self.shard is None else shard_range(n, self.shard)

    def matrices(self, names: list[str], heads: list[int | None], rows: list | None = None, cols=None,
                 orders: list | None = None):
        """Tensors stacked by rows, (sum of out, in) in the backend's weight form; heads[i]: Q/K
        rows to de-interleave for RoPE (None for others); rows[i], cols: a shard's range of tensor i's
        rows and of every tensor's columns (None: all); orders[i]: the rows of tensor i to take, in
        that order (an int array; None: all as stored)."""
        ts = [self.tensor(n) for n in names]
        rows, orders = rows or [None] * len(ts), orders or [None] * len(ts)
        m = self.rows_matrix([TensorRows(t, heads=h, rows=r, cols=cols, order=o)
                              for t, h, r, o in zip(ts, heads, rows, orders)])
        for t in ts:
            self.progress(t)
        return m

    def matrix(self, name: str, cols=None):
        return self.matrices([name], [None], cols=cols)

    def rows_matrix(self, pieces: list["TensorRows"]):
        """Tensors stacked by rows, in the backend's weight form: the file's blocks kept on the GPU
        when any piece has them, else dense."""
        if self.keep_blocks and any(r.tensor.tensor_type.name in BLOCKS for r in pieces):
            return stack_rows([r.host_rows() for r in pieces], self.backend.upload_rows)
        if self.backend.name == "cpu":
            return self.expanded.matrix(pieces, host_matrix) if self.expanded else host_matrix(pieces)
        parts = [r.dense(self) for r in pieces]
        return parts[0] if len(parts) == 1 else self.xp.concatenate(parts)

    def vector(self, name: str, part: tuple[int, int] | None = None):
        t = self.tensor(name)
        self.progress(t)
        v = np.asarray(t.data, dtype=np.float32)
        return self.xp.asarray(v if part is None else v[part[0]:part[1]])

    def small_matrix(self, name: str):
        """A small tensor (a MoE router) as float32 (rows, cols), whatever its type."""
        t = self.tensor(name)
        self.progress(t)
        return self.xp.asarray(TensorRows(t).values())

    def layer(self, i: int) -> LayerWeights:
        c, p = self.cfg, f"blk.{i}."
        if c.hybrid is not None:
            return hybrid_layer(self, i)
        pairs = (c.n_heads, c.n_kv_heads, None) if c.rope_pairs_adjacent else (None, None, None)
        heads = [self.part(c.q_dim), self.part(c.kv_dim), self.part(c.kv_dim)]  # a shard's heads (Megatron's split)
        wqkv = self.matrices([p + "attn_q.weight", p + "attn_k.weight", p + "attn_v.weight"], list(pairs), heads)
        layer = LayerWeights(attn_norm=self.vector(p + "attn_norm.weight"), wqkv=wqkv,
                             wo=self.matrix(p + "attn_output.weight", cols=self.part(c.q_dim)),
                             ffn_norm=self.vector(p + "ffn_norm.weight"))
        if c.qkv_bias:
            layer.bqkv = self.xp.concatenate([self.vector(p + f"attn_{x}.bias", h) for x, h in zip("qkv", heads)])
        if c.qk_norm:
            layer.q_norm, layer.k_norm = self.vector(p + "attn_q_norm.weight"), self.vector(p + "attn_k_norm.weight")
        if c.n_experts:
            layer.router = self.small_matrix(p + "ffn_gate_inp.weight")  # (n_experts, dim)
            layer.experts = self.experts(p)
        else:
            hidden = self.part(c.ffn_dim)  # a shard's hidden units
            layer.w_gate_up = self.matrices([p + "ffn_gate.weight", p + "ffn_up.weight"], [None, None], [hidden, hidden])
            layer.w_down = self.matrix(p + "ffn_down.weight", cols=hidden)
        return layer

    def experts(self, p: str) -> Experts | ExpertCache:
        """A MoE layer's expert tensors as GGUF stacks them, (experts, out, in): on the GPU in their
        blocks as stored (the kernels index an expert's rows), else values; with expert_slots, in host memory
        behind a cache of that many device slots (on the CPU the values as resident ones: the cache counts)."""
        experts = Experts(*(self.expert_stack(p + f"ffn_{x}_exps.weight", host=self.expert_slots is not None)
                            for x in ("gate", "up", "down")))
        if self.expert_slots is None:
            return experts
        return ExpertCache(self.xp, experts, self.expert_slots, self.cfg.n_experts_used)

    def expert_stack(self, name: str, host: bool = False) -> ExpertStack:
        """One stacked expert tensor: on the device, or with `host` (an expert cache's) on a GPU in page-locked host
        memory as the device would hold it, its blocks or fp16 values (the cache's copies at the link's rate)."""
        t = self.tensor(name)
        whole, kind = TensorRows(t), t.tensor_type.name
        if host and self.backend.name != "cpu":
            data = self.backend.pinned(whole.raw() if kind in BLOCKS or kind == "F16" else
                                       whole.values().astype(np.float16))
            kind = kind if kind in BLOCKS else "F16"
        elif self.keep_blocks and kind in BLOCKS:
            data = self.backend.upload_rows([whole.raw()])
        else:
            data, kind = whole.dense(self), "F32" if self.backend.name == "cpu" else "F16"
        self.progress(t)
        rows = int(np.prod(t.shape[1:])) // self.cfg.n_experts  # t.shape is GGUF's (in, out, experts)
        return ExpertStack(kind, data, self.cfg.n_experts, rows, int(t.shape[0]))

    def load(self) -> Weights:
        embd = self.matrix("token_embd.weight")
        layers = [self.layer(i) for i in range(self.cfg.n_layers)]
        out_norm = self.vector("output_norm.weight")
        head = self.matrix("output.weight") if "output.weight" in self.tensors else embd
        self.backend.finish_uploads()
        reserve_expansion(self.backend, layers)
        return Weights(embd, layers, out_norm, head)


def expanded_matrices(layers) -> list[QuantMatrix]:
    """The quantized layer matrices a prompt chunk's GEMMs read expanded to fp16 (a hybrid's linear-attention and
    gate matrices among them; not the head's, nor the experts': moe.cu)."""
    linear = lambda layer: (layer.linear.w_in, layer.linear.w_out) if layer.linear is not None else ()  # noqa: E731
    return [w for layer in layers for w in (layer.wqkv, layer.wo, layer.w_gate_up, layer.w_down, layer.w_gate,
                                            *linear(layer))
            if isinstance(w, QuantMatrix)]


def expansion_bytes(matrices: list[QuantMatrix]) -> int:
    """What their expansions take, in fp16."""
    return sum(w.rows * w.cols * 2 for w in matrices)


def keep_expansions(backend: Backend, layers) -> list[QuantMatrix]:
    """Each of the layers' expanded matrices expanded once and kept (engine/kvcache/prompt_weights.py): a prompt
    chunk's GEMMs then read those. Returns them."""
    matrices = expanded_matrices(layers)
    for w in matrices:
        backend.kernels.keep(w)
    return matrices


def reserve_expansion(backend: Backend, layers) -> None:
    """Room on the device for the largest of them in fp16, where a prompt chunk's GEMMs read it expanded."""
    expanded = [w.rows * w.cols for w in expanded_matrices(layers)]
    if expanded:
        backend.kernels.reserve_scratch(max(expanded))


def host_matrix(pieces: list["TensorRows"]) -> np.ndarray:
    """The CPU's weight: the pieces' float32 rows stacked, (out, in) kept column-major: x @ w.T is then a
    plain GEMM of two row-major operands, which OpenBLAS runs ~1.4x faster for a decode batch of a few
    rows (and as fast for one row or a prompt chunk). Each piece is expanded straight into its rows."""
    out = np.empty((sum(r.n_rows for r in pieces), pieces[0].n_cols), np.float32, order="F")
    start = 0
    for r in pieces:
        r.expand_into(out[start:start + r.n_rows])
        start += r.n_rows
    return out


@dataclass(frozen=True)
class TensorRows:
    """A tensor seen as a (rows, cols) matrix (a stacked (experts, out, in) one as all its rows),
    converted to the form the backend wants. heads: Q/K rows to de-interleave for RoPE; rows of
    blocks permute like rows of values. rows, cols: a tensor-parallel shard's ranges (after the
    de-interleaving; columns of blocks as whole blocks), None for all. order: the rows to take, in that
    order (an int array, after the de-interleaving: a hybrid's pieces of one tensor, its partial RoPE's
    layout), None for all."""

    tensor: object
    heads: int | None = None
    rows: tuple[int, int] | None = None
    cols: tuple[int, int] | None = None
    order: object = None

    @property
    def sharded(self) -> bool:
        return self.rows is not None or self.cols is not None

    @property
    def n_cols(self) -> int:
        return int(self.tensor.shape[0]) if self.cols is None else self.cols[1] - self.cols[0]

    @property
    def n_rows(self) -> int:
        if self.rows is not None:
            return self.rows[1] - self.rows[0]
        return len(self.raw()) if self.order is None else len(self.order)

    def selected(self, w, blocks: bool = False):
        """w, this tensor's (reordered) rows -> the shard's rows and columns (of blocks: their bytes)."""
        if self.rows is not None:
            w = w[self.rows[0] : self.rows[1]]
        if self.cols is not None:
            lo, hi = self.cols
            if blocks:
                kind = self.tensor.tensor_type.name
                size = BLOCKS[kind][0]
                if lo % size or hi % size:
                    raise ModelLoadError(f"tensor parallel: columns {lo}..{hi} of {self.tensor.name} cut its {kind} "
                                         f"blocks of {size} values")
                lo, hi = row_bytes(kind, lo), row_bytes(kind, hi)
            w = w[:, lo:hi]
        return w

    def raw(self) -> np.ndarray:
        data = np.asarray(self.tensor.data)  # (rows, row bytes or cols), or (experts, out, ...) as mapped
        return data.reshape(-1, data.shape[-1])

    def values(self) -> np.ndarray:
        """float32 (rows, cols)."""
        t, raw = self.tensor, self.raw()
        if t.tensor_type in (GGMLQuantizationType.F32, GGMLQuantizationType.F16):
            return raw.astype(np.float32)
        try:
            return dequantize(raw, t.tensor_type.name)
        except NotImplementedError as e:
            raise ModelLoadError(f"unsupported tensor type {t.tensor_type.name} in {t.name}") from e

    def expand_into(self, out: np.ndarray) -> None:
        """The shard's float32 (rows, cols) written into out: a quantized tensor's rows picked (and
        reordered) as blocks, then expanded (the values are the same: a row's values are its blocks')."""
        kind = self.tensor.tensor_type.name
        if kind not in BLOCKS:
            out[...] = self.selected(self.reorder(self.values()))
            return
        raw = self.reorder(self.raw())
        dequantize_into(raw if self.rows is None else raw[self.rows[0]:self.rows[1]], kind, out, self.cols)

    def reorder(self, w, xp=np):
        """w's rows (on xp's device) de-interleaved and taken in `order` where this tensor says."""
        w = deinterleave_heads(w, self.heads) if self.heads else w
        return w if self.order is None else w[xp.asarray(self.order)]

    def host_rows(self) -> HostRows:
        """The rows as stored (blocks, or fp16 values; F32, BF16 and rare types become fp16)."""
        kind = self.tensor.tensor_type.name
        if kind in BLOCKS or kind == "F16":
            return HostRows(kind, self.selected(self.reorder(self.raw()), kind in BLOCKS), self.n_cols)
        return HostRows("F16", self.selected(self.reorder(self.values().astype(np.float16))), self.n_cols)

    def dense(self, loader: "WeightLoader"):
        """(rows, cols) float32 on the CPU; fp16 on the GPU, where only the file's bytes cross the
        bus (F16 as it is, the block types and BF16 expanded by a kernel)."""
        kind = self.tensor.tensor_type.name
        if loader.backend.name == "cpu" or (self.sharded and kind not in BLOCKS and kind != "F16"):
            w = self.selected(self.reorder(self.values()))  # (a shard of BF16, F32 or a rare type: on the host)
            return w if loader.backend.name == "cpu" else loader.xp.asarray(w, dtype=loader.xp.float16)
        raw = self.raw()
        if self.sharded:  # only the shard's bytes cross the bus: its rows picked (and reordered) on the host
            raw = np.ascontiguousarray(self.selected(self.reorder(raw), kind in BLOCKS))
        if kind == "F16":
            w = loader.backend.upload_rows([raw])
        elif kind in DEQUANT:
            w = loader.backend.kernels.dequantize(raw, kind, (len(raw), self.n_cols))
        else:  # F32 and rare types
            w = loader.xp.asarray(self.values(), dtype=loader.xp.float16)
        return w if self.sharded else self.reorder(w, loader.xp)


def load_model(path: str, backend: Backend, keep_blocks: bool = True, rope: RopeOverride = RopeOverride(),
               reader: GGUFFile | None = None, shard: tuple[int, int] | None = None, expert_slots: int | None = None
               ) -> tuple[ModelConfig, Weights, GGUFFile]:
    """keep_blocks: on the GPU, quantized weights stay in their GGUF blocks (else fp16). rope: the
    command line's rope scaling over the file's. reader: the file already opened (else opened here).
    shard: (rank, world) of tensor parallelism: that rank's config and weights only (shard_config, and
    what engine/parallel/tensor_parallel.py's shard_weights makes of the whole, never loading the whole)."""
    reader = reader or GGUFFile(path, "r")
    cfg = read_config(reader)
    scaling, base = rope.apply(cfg.rope, cfg.rope_base)
    cfg = replace(cfg, rope=scaling, rope_base=base)
    ranks = shard_config(cfg, shard[1]) if shard else cfg  # refuses what does not split, before any load
    with plain_pages(backend.name == "cpu"):  # (the CPU's expanded weights: engine/ops/host_pages.py)
        weights = WeightLoader(reader, cfg, backend, keep_blocks, shard, expert_slots).load()
    return ranks, weights, reader
