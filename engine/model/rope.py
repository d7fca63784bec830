"""RoPE's rotation frequencies and their long-context scaling, as llama.cpp reads them from a GGUF:

- per-frequency factors (the `rope_freqs.weight` tensor: Llama 3.1 / 3.2 / 3.3's scaling, which
  the converter precomputes from the `llama3` rope_scaling of the checkpoint): frequency i is
  divided by factor i;
- linear (position interpolation): every frequency divided by the scale;
- YaRN (Qwen2.5, Qwen3 past 32K): each frequency mixed between its interpolated and original
  value by where its wavelength falls against the original context ("NTK-by-parts"), and the
  rotation's magnitude multiplied by 1 + 0.1 ln(scale).

The tables engine/model/forward.py builds hold cos(pos * inv_freq) * mscale and sin(...) * mscale; every
backend's RoPE (NumPy, the GPU's rope_store) reads them, so no kernel knows any of this.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

KINDS = ("none", "linear", "yarn")


@dataclass(frozen=True)
class RopeScaling:
    kind: str = "none"  # none | linear | yarn (GGUF rope.scaling.type; per-frequency factors apply under any)
    scale: float = 1.0  # the context's scaling factor (GGUF rope.scaling.factor); frequencies / scale
    original_ctx: int = 0  # the context trained before scaling (rope.scaling.original_context_length)
    attn_factor: float = 1.0  # YaRN's magnitude, times 1 + 0.1 ln(scale) (rope.scaling.yarn_attn_factor)
    beta_fast: float = 32.0  # YaRN's correction range: rotations over the original context beyond which
    beta_slow: float = 1.0  # a frequency keeps its value, and below which it is fully interpolated
    freq_factors: tuple[float, ...] | None = None  # rope_freqs.weight: (head_dim / 2,)

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"rope scaling {self.kind!r} is not supported (supported: {', '.join(KINDS)})")
        if self.scale <= 0:
            raise ValueError(f"the rope scale must be > 0, got {self.scale:g}")

    @property
    def active(self) -> bool:
        return self.freq_factors is not None or (self.kind != "none" and self.scale != 1.0)

    def describe(self) -> str:
        parts = [] if self.kind == "none" else [f"{self.kind} x{self.scale:g}"
                                                + (f" from {self.original_ctx}" if self.kind == "yarn" else "")]
        parts += ["per-frequency factors"] if self.freq_factors is not None else []
        return ", ".join(parts) or "none"


def frequencies(head_dim: int, base: float, scaling: RopeScaling) -> tuple[np.ndarray, float]:
    """(inv_freq (head_dim / 2,) float64, mscale): the angle of pair i at position p is
    p * inv_freq[i], and cos and sin are multiplied by mscale (llama.cpp's rope_yarn)."""
    half = head_dim // 2
    theta = 1.0 / base ** (np.arange(half, dtype=np.float64) * 2 / head_dim)  # (half,)
    if scaling.freq_factors is not None:
        factors = np.asarray(scaling.freq_factors, dtype=np.float64)
        if factors.shape != (half,):
            raise ValueError(f"rope_freqs holds {factors.size} factors, the heads rotate {half} pairs")
        theta = theta / factors
    if scaling.kind == "none" or scaling.scale == 1.0:
        return theta, 1.0
    interpolated = theta / scaling.scale
    if scaling.kind == "linear":
        return interpolated, 1.0
    low, high = yarn_range(head_dim, base, scaling)
    ramp = 1.0 - np.clip((np.arange(half) - low) / max(0.001, high - low), 0.0, 1.0)  # 1: keep the original
    mixed = interpolated * (1.0 - ramp) + theta * ramp
    return mixed, scaling.attn_factor * (1.0 + 0.1 * math.log(scaling.scale))


def yarn_range(head_dim: int, base: float, scaling: RopeScaling) -> tuple[float, float]:
    """The pairs between which YaRN moves from original to interpolated frequencies: where a pair
    turns beta_fast, then beta_slow, times over the original context."""
    def pair(rotations: float) -> float:
        return head_dim * math.log(scaling.original_ctx / (rotations * 2 * math.pi)) / (2 * math.log(base))

    return max(0.0, math.floor(pair(scaling.beta_fast))), min(head_dim - 1.0, math.ceil(pair(scaling.beta_slow)))


def from_gguf(field, freq_factors, context_length: int) -> RopeScaling:
    """The file's scaling: field(key, default) reads `{arch}.rope.scaling.*`; freq_factors is the
    rope_freqs tensor's values or None."""
    linear = field("rope.scale_linear", None)  # an older key: linear scaling by this factor
    kind = str(field("rope.scaling.type", "none" if linear is None else "linear"))
    scale = float(field("rope.scaling.factor", linear if linear is not None else 1.0) or 1.0)
    return RopeScaling(kind=kind if kind in KINDS else _unsupported(kind), scale=scale,
                       original_ctx=int(field("rope.scaling.original_context_length", context_length)),
                       attn_factor=float(field("rope.scaling.yarn_attn_factor", 1.0)),
                       beta_fast=float(field("rope.scaling.yarn_beta_fast", 32.0)),
                       beta_slow=float(field("rope.scaling.yarn_beta_slow", 1.0)),
                       freq_factors=None if freq_factors is None else tuple(float(f) for f in freq_factors))


def _unsupported(kind: str) -> str:
    raise ValueError(f"the model's rope scaling {kind!r} is not supported (supported: {', '.join(KINDS)})")


@dataclass(frozen=True)
class RopeOverride:
    """What the command line changes (llama.cpp's --rope-scaling, --rope-scale, --rope-freq-base,
    --yarn-orig-ctx); None leaves the file's value."""
    kind: str | None = None
    scale: float | None = None
    freq_base: float | None = None
    original_ctx: int | None = None

    def __post_init__(self):
        if self.kind is not None and self.kind not in KINDS:
            raise ValueError(f"--rope-scaling must be one of {', '.join(KINDS)}")
        if self.scale is not None and self.scale <= 0:
            raise ValueError(f"--rope-scale must be > 0, got {self.scale:g}")
        if self.freq_base is not None and self.freq_base <= 0:
            raise ValueError(f"--rope-freq-base must be > 0, got {self.freq_base:g}")
        if self.original_ctx is not None and self.original_ctx < 1:
            raise ValueError(f"--yarn-orig-ctx must be >= 1, got {self.original_ctx}")

    def apply(self, scaling: RopeScaling, base: float) -> tuple[RopeScaling, float]:
        changes = {k: v for k, v in (("kind", self.kind), ("scale", self.scale), ("original_ctx", self.original_ctx))
                   if v is not None}
        return replace(scaling, **changes), self.freq_base if self.freq_base is not None else base

    def engine_args(self) -> list[str]:
        return [arg for flag, value in (("--rope-scaling", self.kind), ("--rope-scale", self.scale),
                                        ("--rope-freq-base", self.freq_base), ("--yarn-orig-ctx", self.original_ctx))
                if value is not None for arg in (flag, f"{value:g}" if isinstance(value, float) else str(value))]
