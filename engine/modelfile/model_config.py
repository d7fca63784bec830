"""A GGUF's model: its architecture's shapes and settings read from the file's metadata, validated
(ModelConfig), and the error a file that cannot be served raises. Everything here reads the file's header
only (engine/modelfile/gguf_file.py); the weights are read by engine/model/weights.py."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from engine.modelfile.gguf_file import GGUFFile
from engine.modelfile.rope_config import RopeScaling
from engine.modelfile.rope_config import from_gguf as rope_from_gguf

# What differs between the supported families, as the forward pass reads it from ModelConfig:
#   llama     Q/K rows stored with RoPE pairs adjacent (llama.cpp's "normal" RoPE), reordered at load
#   qwen2     bias on Q, K and V; RoPE on halves (NEOX) as stored
#   qwen3     RMSNorm per head on Q and K, no bias; head width from attention.key_length
#   qwen3moe  qwen3's attention; a routed mixture of experts in place of the feed-forward
#   qwen3next, qwen35, qwen35moe  hybrids (HybridConfig): Gated DeltaNet layers and, every
#             full_attention_interval layers, gated attention with RoPE on part of each head; qwen3next
#             and qwen35moe route experts beside a shared expert, qwen35 has a dense feed-forward
HYBRID_ARCHITECTURES = ("qwen3next", "qwen35", "qwen35moe")
SUPPORTED_ARCHITECTURES = ("llama", "qwen2", "qwen3", "qwen3moe", *HYBRID_ARCHITECTURES)
MAX_DEFAULT_CTX = 8192  # without --ctx, the model's trained context, capped here (KV memory)
POOLING_TYPES = {0: "none", 1: "mean", 2: "cls", 3: "last", 4: "rank"}  # <arch>.pooling_type: llama.cpp's enum
POOLINGS = ("mean", "cls", "last")  # those embeddings are served with (engine/runner/pooling.py)

class ModelLoadError(RuntimeError):
    """The file cannot be served: unsupported architecture, tensor type, or missing tensor."""


@dataclass(frozen=True)
class HybridConfig:
    """A hybrid model's linear-attention shapes and its layer schedule (GGUF's ssm.* keys)."""

    n_layers: int
    interval: int  # every interval-th layer (the last of each run) is full attention
    conv_kernel: int  # the causal convolution's width
    k_heads: int  # q / k heads of the delta rule (ssm.group_count)
    v_heads: int  # value heads (ssm.time_step_rank); each k head serves v_heads / k_heads of them
    dk: int  # q / k head width (ssm.state_size)
    dv: int  # value head width (ssm.inner_size / v_heads)
    rope_dim: int  # the rotated part of each full-attention head (rope.dimension_count)
    shared_ffn_dim: int = 0  # the shared expert's width (0: none)
    tiled: bool = False  # value head j's k head is j % k_heads (qwen35's files, reordered for ggml's
    # broadcast), else j // (v_heads / k_heads) (qwen3next's, grouped as transformers has them)
    l2_eps: float = 1e-6  # q and k's L2 normalization, as the references

    def __post_init__(self):
        if self.interval < 1 or self.v_heads % self.k_heads or self.rope_dim % 2 or self.conv_kernel < 1:
            raise ModelLoadError(f"inconsistent linear-attention shapes: {self}")

    @property
    def attention_layers(self) -> list[int]:
        return [i for i in range(self.n_layers) if (i + 1) % self.interval == 0]

    @property
    def linear_layers(self) -> list[int]:
        return [i for i in range(self.n_layers) if (i + 1) % self.interval]

    @property
    def channels(self) -> int:
        """The convolution's channels: q, k and v of every head."""
        return 2 * self.k_heads * self.dk + self.v_heads * self.dv


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
    qkv_bias: bool = False  # qwen2: Q, K and V projections carry a bias
    qk_norm: bool = False  # qwen3: RMSNorm over each head of Q and K before RoPE
    rope_pairs_adjacent: bool = True  # llama's files: Q/K rows reordered at load so RoPE rotates halves
    n_experts: int = 0  # qwen3moe: experts per layer (0: a dense feed-forward)
    n_experts_used: int = 0  # experts each token is routed to
    expert_ffn_dim: int = 0
    expert_weights_norm: bool = False  # the chosen experts' weights rescaled to sum to 1
    rope: RopeScaling = RopeScaling()  # long-context scaling of the rotation (engine/modelfile/rope_config.py)
    hybrid: HybridConfig | None = None  # qwen3next, qwen35, qwen35moe

    def __post_init__(self):
        if self.arch not in SUPPORTED_ARCHITECTURES:
            raise ModelLoadError(f"unsupported architecture {self.arch!r} (supported: {', '.join(SUPPORTED_ARCHITECTURES)})")
        if self.n_heads % self.n_kv_heads or self.head_dim % 2:
            raise ModelLoadError(f"inconsistent head shapes: dim={self.dim} heads={self.n_heads} "
                                 f"kv_heads={self.n_kv_heads} head_dim={self.head_dim}")
        if self.n_experts and not 0 < self.n_experts_used <= self.n_experts:
            raise ModelLoadError(f"{self.n_experts_used} experts used of {self.n_experts}")

    @property
    def max_context(self) -> int:
        """The context the model serves: its trained one, or what linear / YaRN scaling stretches
        the original to (Qwen2.5's files say 32,768 and scale it 4x)."""
        if self.rope.kind != "none" and self.rope.scale > 1:
            return max(self.context_length, int(self.rope.original_ctx * self.rope.scale))
        return self.context_length

    @property
    def default_ctx(self) -> int:
        return min(self.max_context, MAX_DEFAULT_CTX)

    @property
    def q_dim(self) -> int:
        """Width of the attention's query (and output projection input): heads x head width, which
        need not be the model width (Qwen3-30B-A3B: 32 x 128 over 2048)."""
        return self.n_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.n_kv_heads * self.head_dim

    @property
    def kv_layers(self) -> int:
        """Layers with K/V rows: all of them, or a hybrid's full-attention ones."""
        return self.n_layers if self.hybrid is None else len(self.hybrid.attention_layers)


def field_value(reader: GGUFFile, key: str, default=None):
    f = reader.fields.get(key)
    return default if f is None else f.contents()


def file_pooling(reader: GGUFFile, arch: str) -> str:
    """How the file says its hidden states are pooled into an embedding (<arch>.pooling_type, by name;
    "unset" where it says nothing, as a generative model's file)."""
    value = field_value(reader, f"{arch}.pooling_type")
    return "unset" if value is None else POOLING_TYPES.get(int(value), f"type{int(value)}")


def read_config(reader: GGUFFile) -> ModelConfig:
    arch = field_value(reader, "general.architecture", "?")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ModelLoadError(f"unsupported architecture {arch!r} (supported: {', '.join(SUPPORTED_ARCHITECTURES)})")
    g = lambda k, d=None: field_value(reader, f"{arch}.{k}", d)  # noqa: E731
    n_heads = int(g("attention.head_count"))
    dim = int(g("embedding_length"))
    vocab = len(reader.fields["tokenizer.ggml.tokens"].data)
    head_dim = int(g("attention.key_length", g("rope.dimension_count", dim // n_heads)))
    moe = arch in ("qwen3moe", "qwen3next", "qwen35moe")
    freqs = next((t for t in reader.tensors if t.name == "rope_freqs.weight"), None)
    context = int(g("context_length"))
    # a file converted with its MTP (multi-token prediction) layers counts them in block_count, after the
    # model's own: they are not part of the forward pass (speculative decoding's, not run in this version)
    n_layers = int(g("block_count")) - int(g("nextn_predict_layers", 0))
    try:
        rope = rope_from_gguf(g, None if freqs is None else np.asarray(freqs.data, dtype=np.float32).reshape(-1), context)
    except ValueError as e:
        raise ModelLoadError(str(e)) from None
    return ModelConfig(
        arch=arch, name=str(field_value(reader, "general.name", "unnamed")),
        n_layers=n_layers, dim=dim, ffn_dim=int(g("feed_forward_length", 0)),
        n_heads=n_heads, n_kv_heads=int(g("attention.head_count_kv", n_heads)),
        head_dim=head_dim, vocab_size=int(g("vocab_size", vocab)),
        context_length=context, rope_base=float(g("rope.freq_base", 10000.0)),
        norm_eps=float(g("attention.layer_norm_rms_epsilon", 1e-5)),
        qkv_bias=arch == "qwen2", qk_norm=arch in ("qwen3", "qwen3moe", *HYBRID_ARCHITECTURES),
        rope_pairs_adjacent=arch == "llama",
        n_experts=int(g("expert_count", 0)) if moe else 0, n_experts_used=int(g("expert_used_count", 0)) if moe else 0,
        expert_ffn_dim=int(g("expert_feed_forward_length", 0)) if moe else 0,
        expert_weights_norm=bool(g("expert_weights_norm", True)) if moe else False,
        rope=rope, hybrid=read_hybrid(g, arch, n_layers, head_dim) if arch in HYBRID_ARCHITECTURES else None,
    )


def read_hybrid(g, arch: str, n_layers: int, head_dim: int) -> HybridConfig:
    """A hybrid's HybridConfig from its `<arch>.*` keys (g reads one)."""
    try:
        v_heads = int(g("ssm.time_step_rank"))
        return HybridConfig(
            n_layers=n_layers, interval=int(g("full_attention_interval", 4)), conv_kernel=int(g("ssm.conv_kernel")),
            k_heads=int(g("ssm.group_count")), v_heads=v_heads, dk=int(g("ssm.state_size")),
            dv=int(g("ssm.inner_size")) // v_heads, rope_dim=int(g("rope.dimension_count", head_dim)),
            shared_ffn_dim=int(g("expert_shared_feed_forward_length", 0)), tiled=arch != "qwen3next")
    except TypeError:  # a key missing: int(None)
        raise ModelLoadError("a hybrid model's file lacks one of its ssm.* keys") from None
