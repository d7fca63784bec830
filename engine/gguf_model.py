"""GGUF -> validated ModelConfig and dequantized weights (memory-mapped read via the gguf package)."""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass

import numpy as np
from gguf import GGUFReader, GGMLQuantizationType
from gguf.quants import dequantize

from engine.backend import Backend

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
    attn_norm: object  # (dim,) float32
    wqkv: object  # (dim, dim + 2*kv_dim): q and k rows de-interleaved for half-split RoPE
    wo: object  # (dim, dim)
    ffn_norm: object  # (dim,) float32
    w_gate_up: object  # (dim, 2*ffn_dim)
    w_down: object  # (ffn_dim, dim)


@dataclass
class Weights:
    tok_embd: object  # (vocab, dim)
    layers: list[LayerWeights]
    out_norm: object  # (dim,) float32
    head: object  # (dim, vocab); a transposed view of tok_embd when tied


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
    """GGUF tensor -> float32 (rows, cols) in numpy order (out_features, in_features)."""
    try:
        if t.tensor_type in (GGMLQuantizationType.F32, GGMLQuantizationType.F16):
            return np.asarray(t.data, dtype=np.float32)
        return dequantize(t.data, t.tensor_type).astype(np.float32, copy=False)
    except NotImplementedError as e:
        raise ModelLoadError(f"unsupported tensor type {t.tensor_type.name} in {t.name}") from e


def deinterleave_heads(w: np.ndarray, n_heads: int) -> np.ndarray:
    """llama.cpp stores Q/K rows with RoPE pairs adjacent; reorder each head to [evens, odds]
    so RoPE rotates halves (contiguous slices). q.k is unchanged since q and k move alike."""
    rows, cols = w.shape
    d = rows // n_heads
    return w.reshape(n_heads, d // 2, 2, cols).transpose(0, 2, 1, 3).reshape(rows, cols)


class WeightLoader:
    def __init__(self, reader: GGUFReader, cfg: ModelConfig, backend: Backend):
        self.tensors = {t.name: t for t in reader.tensors}
        self.cfg, self.backend = cfg, backend
        self.done, self.started = 0, time.monotonic()

    def host(self, name: str) -> np.ndarray:
        if name not in self.tensors:
            raise ModelLoadError(f"missing tensor {name}")
        self.done += 1
        if self.done % 40 == 0 or self.done == len(self.tensors):
            print(f"strata: loading weights {self.done}/{len(self.tensors)} tensors "
                  f"({time.monotonic() - self.started:.1f}s)", file=sys.stderr, flush=True)
        return dequantize_tensor(self.tensors[name])

    def device(self, host: np.ndarray, weight: bool = True):
        dtype = self.backend.weight_dtype if weight else np.float32
        return self.backend.asarray(np.ascontiguousarray(host), dtype=dtype)

    def layer(self, i: int) -> LayerWeights:
        c, p = self.cfg, f"blk.{i}."
        q = deinterleave_heads(self.host(p + "attn_q.weight"), c.n_heads)
        k = deinterleave_heads(self.host(p + "attn_k.weight"), c.n_kv_heads)
        v = self.host(p + "attn_v.weight")
        gate, up = self.host(p + "ffn_gate.weight"), self.host(p + "ffn_up.weight")
        return LayerWeights(
            attn_norm=self.device(self.host(p + "attn_norm.weight"), weight=False),
            wqkv=self.device(np.concatenate([q, k, v]).T),
            wo=self.device(self.host(p + "attn_output.weight").T),
            ffn_norm=self.device(self.host(p + "ffn_norm.weight"), weight=False),
            w_gate_up=self.device(np.concatenate([gate, up]).T),
            w_down=self.device(self.host(p + "ffn_down.weight").T),
        )

    def load(self) -> Weights:
        embd = self.device(self.host("token_embd.weight"))
        layers = [self.layer(i) for i in range(self.cfg.n_layers)]
        out_norm = self.device(self.host("output_norm.weight"), weight=False)
        head = self.device(self.host("output.weight")).T if "output.weight" in self.tensors else embd.T
        return Weights(embd, layers, out_norm, head)


def load_model(path: str, backend: Backend) -> tuple[ModelConfig, Weights, GGUFReader]:
    reader = GGUFReader(path, "r")
    cfg = read_config(reader)
    return cfg, WeightLoader(reader, cfg, backend).load(), reader
