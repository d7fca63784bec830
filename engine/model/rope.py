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

import numpy as np

from engine.modelfile.rope_config import RopeScaling


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
