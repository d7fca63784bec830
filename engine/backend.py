"""The NumPy/CuPy switch. The only module that imports cupy; the rest is array code over `xp`."""
from __future__ import annotations

import sys
from dataclasses import dataclass
from types import ModuleType

import numpy as np


class ArrayOps:
    """The elementwise pieces of the forward pass as plain array code over xp."""

    def __init__(self, xp: ModuleType):
        self.xp = xp

    def rms_norm(self, x, weight, eps: float):
        """x: (n, dim), weight: (dim,)."""
        return x * (1.0 / self.xp.sqrt(self.xp.mean(x * x, axis=-1, keepdims=True) + eps)) * weight

    def rope(self, x, cos, sin):
        """x: (n, heads, d) with each head laid out [evens, odds]; cos/sin: (n, 1, d/2)."""
        half = x.shape[-1] // 2
        x1, x2 = x[..., :half], x[..., half:]
        return self.xp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)

    def silu_mul(self, gate, up):
        return gate / (1.0 + self.xp.exp(-gate)) * up


class FusedCupyOps(ArrayOps):
    """One CUDA kernel for each piece instead of 4 to 8 CuPy calls: a decode step on a GPU is
    bound by kernel launches, not arithmetic."""

    def __init__(self, cp: ModuleType):
        super().__init__(cp)
        self.sum_squares = cp.ReductionKernel("T x", "T y", "x * x", "a + b", "y = a", "0", "strata_sum_squares")
        self.rms_scale = cp.ElementwiseKernel(
            "T x, T ss, T w, T inv_n, T eps", "T y", "y = x / sqrt(ss * inv_n + eps) * w", "strata_rms_scale")
        self.silu_mul_kernel = cp.ElementwiseKernel(
            "T g, T u", "T y", "y = g / (1 + exp(-g)) * u", "strata_silu_mul")
        self.rope_kernel = cp.ElementwiseKernel(
            "raw T x, raw T cos, raw T sin, int32 heads, int32 d", "T y",
            """
            const int half = d / 2, j = i % d, row = i / d, t = row / heads;
            const int k = j < half ? j : j - half;
            const T c = cos[t * half + k], s = sin[t * half + k];
            const T a = x[row * d + k], b = x[row * d + k + half];
            y = j < half ? a * c - b * s : b * c + a * s;
            """, "strata_rope")

    def rms_norm(self, x, weight, eps: float):
        ss = self.sum_squares(x, axis=-1, keepdims=True)  # (n, 1)
        return self.rms_scale(x, ss, weight, x.dtype.type(1.0 / x.shape[-1]), x.dtype.type(eps))

    def rope(self, x, cos, sin):
        x = self.xp.ascontiguousarray(x)
        return self.rope_kernel(x, cos, sin, x.shape[1], x.shape[2], self.xp.empty_like(x))

    def silu_mul(self, gate, up):
        return self.silu_mul_kernel(gate, up)


@dataclass(frozen=True)
class Backend:
    name: str  # "cpu" | "gpu"
    xp: ModuleType  # numpy or cupy
    weight_dtype: type  # float32 on the CPU, float16 on the GPU
    device_name: str
    ops: ArrayOps

    def asarray(self, host: np.ndarray, dtype=None):
        return self.xp.asarray(host, dtype=dtype or host.dtype)

    def to_host(self, arr) -> np.ndarray:
        return arr if self.xp is np else self.xp.asnumpy(arr)

    def matmul(self, x, w):
        """x: (n, k) float32, w: (k, m) weight_dtype -> (n, m) float32 (fp32 accumulate on GPU)."""
        if w.dtype == x.dtype:
            return x @ w
        return (x.astype(w.dtype) @ w).astype(self.xp.float32)

    def synchronize(self) -> None:
        if self.xp is not np:
            self.xp.cuda.Stream.null.synchronize()


def cpu_backend() -> Backend:
    return Backend("cpu", np, np.float32, "cpu (numpy)", ArrayOps(np))


def gpu_backend() -> Backend:
    import cupy as cp  # optional extra: pip install .[gpu]

    cp.cuda.runtime.getDeviceCount()  # raises without a driver or a device
    props = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)
    name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    return Backend("gpu", cp, cp.float16, name, FusedCupyOps(cp))


def select_backend(device: str) -> Backend:
    """device: auto | cpu | gpu. `auto` falls back to NumPy with one line on stderr."""
    if device == "cpu":
        return cpu_backend()
    try:
        return gpu_backend()
    except Exception as e:  # ImportError, CUDARuntimeError, ...
        if device == "gpu":
            raise RuntimeError(f"--device gpu requested but CuPy/CUDA is unavailable: {e}") from e
        print(f"strata: no usable GPU ({type(e).__name__}: {e}); using NumPy on the CPU",
              file=sys.stderr, flush=True)
        return cpu_backend()
