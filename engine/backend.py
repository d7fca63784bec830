"""The NumPy/CuPy switch. The only module that imports cupy; the rest is array code over `xp`."""
from __future__ import annotations

import sys
from dataclasses import dataclass
from types import ModuleType

import numpy as np


@dataclass(frozen=True)
class Backend:
    name: str  # "cpu" | "gpu"
    xp: ModuleType  # numpy or cupy
    weight_dtype: type  # float32 on the CPU, float16 on the GPU
    device_name: str

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
    return Backend("cpu", np, np.float32, "cpu (numpy)")


def gpu_backend() -> Backend:
    import cupy as cp  # optional extra: pip install .[gpu]

    cp.cuda.runtime.getDeviceCount()  # raises without a driver or a device
    props = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)
    name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    return Backend("gpu", cp, cp.float16, name)


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
