"""RoPE scaling as a model file states it (RopeScaling, read from `{arch}.rope.scaling.*` as llama.cpp
reads it) and as the command line overrides it (RopeOverride, llama.cpp's --rope-scaling, --rope-scale,
--rope-freq-base, --yarn-orig-ctx; the server forwards them to its engine). The frequencies these settings
give are computed by engine/model/rope.py."""
from __future__ import annotations

import argparse
from dataclasses import dataclass, replace

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


def add_rope_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("rope scaling (default: the model file's)")
    g.add_argument("--rope-scaling", choices=KINDS, help="none, linear (position interpolation) or yarn")
    g.add_argument("--rope-scale", type=float, metavar="N", help="the context's scaling factor: the rotation "
                                                                 "frequencies are divided by N")
    g.add_argument("--rope-freq-base", type=float, metavar="N", help="RoPE's base frequency")
    g.add_argument("--yarn-orig-ctx", type=int, metavar="N", help="YaRN: the context the model was trained at")


def rope_from_args(a: argparse.Namespace) -> RopeOverride:
    return RopeOverride(a.rope_scaling, a.rope_scale, a.rope_freq_base, a.yarn_orig_ctx)
