"""GGUF -> validated ModelConfig and dequantized weights (memory-mapped read via the gguf package)."""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass

import numpy as np
from gguf import GGUFReader, GGMLQuantizationType
from gguf.quants import dequantize

from engine.backend import Backend
from engine.kernels import DEQUANT  # the GGUF types the device expands itself (no CuPy import)
from engine.quantized import BLOCKS, HostRows, QuantMatrix, stack_rows

SUPPORTED_ARCHITECTURES = ("llama",)
MAX_DEFAULT_CTX = 8192  # without --ctx, the model's trained context, capped here (KV memory)


class ModelLoadError(RuntimeError):
    """The file cannot be served: unsupported architecture, tensor type, or missing tensor."""


@dataclass(frozen=True)
class ModelConfig:
    arch: str
    name: str
    n_layers: int
    dim: int
    ffn_dim: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    vocab_size: int
    context_length: int
    rope_base: float
    norm_eps: float

    def __post_init__(self):
        if self.arch not in SUPPORTED_ARCHITECTURES:
            raise ModelLoadError(f"unsupported architecture {self.arch!r} (supported: llama)")
        if self.dim != self.n_heads * self.head_dim or self.n_heads % self.n_kv_heads:
            raise ModelLoadError(f"inconsistent head shapes: dim={self.dim} heads={self.n_heads} "
                                 f"kv_heads={self.n_kv_heads} head_dim={self.head_dim}")

    @property
    def default_ctx(self) -> int:
        return min(self.context_length, MAX_DEFAULT_CTX)

    @property
    def kv_dim(self) -> int:
        return self.n_kv_heads * self.head_dim


@dataclass
class LayerWeights:
    """Weights as GGUF stores them, (out_features, in_features): float32 on the CPU; on the GPU fp16,
    or a QuantMatrix of the file's blocks (engine/quantized.py) for a quantized tensor."""

    attn_norm: object  # (dim,) float32
    wqkv: object  # (dim + 2*kv_dim, dim): q and k rows de-interleaved for half-split RoPE
    wo: object  # (dim, dim)
    ffn_norm: object  # (dim,) float32
    w_gate_up: object  # (2*ffn_dim, dim)
    w_down: object  # (dim, ffn_dim)


@dataclass
class Weights:
    tok_embd: object  # (vocab, dim)
    layers: list[LayerWeights]
    out_norm: object  # (dim,) float32
    head: object  # (vocab, dim); tok_embd itself when tied


def field_value(reader: GGUFReader, key: str, default=None):
    f = reader.fields.get(key)
    return default if f is None else f.contents()


def read_config(reader: GGUFReader) -> ModelConfig:
    arch = field_value(reader, "general.architecture", "?")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ModelLoadError(f"unsupported architecture {arch!r} (supported: llama)")
    g = lambda k, d=None: field_value(reader, f"{arch}.{k}", d)  # noqa: E731
    n_heads = int(g("attention.head_count"))
    dim = int(g("embedding_length"))
    vocab = len(reader.fields["tokenizer.ggml.tokens"].data)
    return ModelConfig(
        arch=arch, name=str(field_value(reader, "general.name", "unnamed")),
        n_layers=int(g("block_count")), dim=dim, ffn_dim=int(g("feed_forward_length")),
        n_heads=n_heads, n_kv_heads=int(g("attention.head_count_kv", n_heads)),
        head_dim=int(g("rope.dimension_count", dim // n_heads)), vocab_size=int(g("vocab_size", vocab)),
        context_length=int(g("context_length")), rope_base=float(g("rope.freq_base", 10000.0)),
        norm_eps=float(g("attention.layer_norm_rms_epsilon", 1e-5)),
    )


def dequantize_tensor(t) -> np.ndarray:
    """GGUF tensor -> float32 (rows, cols) in numpy order (out_features, in_features), on the host."""
    try:
        if t.tensor_type in (GGMLQuantizationType.F32, GGMLQuantizationType.F16):
            return np.asarray(t.data, dtype=np.float32)
        return dequantize(t.data, t.tensor_type).astype(np.float32, copy=False)
    except NotImplementedError as e:
        raise ModelLoadError(f"unsupported tensor type {t.tensor_type.name} in {t.name}") from e


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

    def __init__(self, reader: GGUFReader, cfg: ModelConfig, backend: Backend, keep_blocks: bool = True):
        self.tensors = {t.name: t for t in reader.tensors}
        self.cfg, self.backend, self.xp = cfg, backend, backend.xp
        self.keep_blocks = keep_blocks and backend.name == "gpu"
        self.total_bytes = sum(int(t.n_bytes) for t in reader.tensors)
        self.done_bytes, self.started = 0, time.monotonic()
        self.reported = self.started

    def tensor(self, name: str):
        if name not in self.tensors:
            raise ModelLoadError(f"missing tensor {name}")
        return self.tensors[name]

    def progress(self, t) -> None:
        self.done_bytes += int(t.n_bytes)
        now = time.monotonic()
        if now - self.reported >= self.REPORT_EVERY_S or self.done_bytes == self.total_bytes:
            self.reported = now
            print(f"strata: loading weights {self.done_bytes / 2**30:.2f}/{self.total_bytes / 2**30:.2f} GiB "
                  f"({now - self.started:.1f}s)", file=sys.stderr, flush=True)

    def matrices(self, names: list[str], heads: list[int | None]):
        """Tensors stacked by rows, (sum of out, in) in the backend's weight form; heads[i]: Q/K
        rows to de-interleave for RoPE (None for others)."""
        ts = [self.tensor(n) for n in names]
        if self.keep_blocks and any(t.tensor_type.name in BLOCKS for t in ts):
            pieces = [self.host_rows(t, h) for t, h in zip(ts, heads)]
            m = stack_rows(pieces, self.xp.asarray)
        else:
            parts = [self.dense(t, h) for t, h in zip(ts, heads)]
            m = parts[0] if len(parts) == 1 else self.xp.concatenate(parts)
        for t in ts:
            self.progress(t)
        return m

    def matrix(self, name: str):
        return self.matrices([name], [None])

    def host_rows(self, t, heads: int | None) -> HostRows:
        """A tensor's rows as stored (blocks, or fp16 values), Q/K rows reordered: rows of blocks
        permute like rows of values."""
        kind, cols = t.tensor_type.name, int(t.shape[0])
        if kind in BLOCKS or kind == "F16":
            data = np.asarray(t.data)  # (rows, row bytes) or (rows, cols), as the reader maps it
        else:  # F32, BF16, rare types among quantized ones
            data, kind = dequantize_tensor(t).astype(np.float16), "F16"
        return HostRows(kind, deinterleave_heads(data, heads) if heads else data, cols)

    def dense(self, t, heads: int | None):
        """(out, in) float32 on the CPU, fp16 on the GPU."""
        if self.backend.name == "cpu":
            w = dequantize_tensor(t)
        else:
            kind, (cols, rows) = t.tensor_type.name, (int(t.shape[0]), int(t.shape[1]))
            if kind == "F16":
                w = self.xp.asarray(t.data)  # straight from the mapped file
            elif kind in DEQUANT:
                w = self.backend.kernels.dequantize(t.data, kind, (rows, cols))
            else:
                w = self.xp.asarray(dequantize_tensor(t), dtype=self.xp.float16)  # F32 and rare types
        return deinterleave_heads(w, heads) if heads else w

    def vector(self, name: str):
        t = self.tensor(name)
        self.progress(t)
        return self.xp.asarray(np.asarray(t.data, dtype=np.float32))

    def layer(self, i: int) -> LayerWeights:
        c, p = self.cfg, f"blk.{i}."
        wqkv = self.matrices([p + "attn_q.weight", p + "attn_k.weight", p + "attn_v.weight"],
                             [c.n_heads, c.n_kv_heads, None])
        w_gate_up = self.matrices([p + "ffn_gate.weight", p + "ffn_up.weight"], [None, None])
        return LayerWeights(attn_norm=self.vector(p + "attn_norm.weight"), wqkv=wqkv,
                            wo=self.matrix(p + "attn_output.weight"), ffn_norm=self.vector(p + "ffn_norm.weight"),
                            w_gate_up=w_gate_up, w_down=self.matrix(p + "ffn_down.weight"))

    def load(self) -> Weights:
        embd = self.matrix("token_embd.weight")
        layers = [self.layer(i) for i in range(self.cfg.n_layers)]
        out_norm = self.vector("output_norm.weight")
        head = self.matrix("output.weight") if "output.weight" in self.tensors else embd
        expanded = [w.rows * w.cols for layer in layers for w in (layer.wqkv, layer.wo, layer.w_gate_up, layer.w_down)
                    if isinstance(w, QuantMatrix)]  # a prompt chunk's GEMMs read these expanded (not the head)
        if expanded:
            self.backend.kernels.reserve_scratch(max(expanded))
        return Weights(embd, layers, out_norm, head)


def load_model(path: str, backend: Backend, keep_blocks: bool = True) -> tuple[ModelConfig, Weights, GGUFReader]:
    """keep_blocks: on the GPU, quantized weights stay in their GGUF blocks (else fp16)."""
    reader = GGUFReader(path, "r")
    cfg = read_config(reader)
    return cfg, WeightLoader(reader, cfg, backend, keep_blocks).load(), reader
