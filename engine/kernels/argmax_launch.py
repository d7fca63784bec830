"""Launcher of argmax.cu: each row's first index of its maximum, on the device."""
from __future__ import annotations

from types import ModuleType

import numpy as np


class ArgmaxLauncher:
    """Mixed into GpuKernels, which sets what it reads: cp (CuPy), fn (kernel name -> function)."""

    cp: ModuleType
    fn: dict

    def argmax(self, logits):
        """logits: (rows, n) fp32 -> (rows,) int64 on the device: each row's first index of its
        maximum (numpy.argmax)."""
        logits = logits.reshape(-1, logits.shape[-1])
        out = self.cp.empty(logits.shape[0], dtype=self.cp.int64)
        self.fn["argmax_first"]((logits.shape[0],), (1024,), (logits, out, np.int32(logits.shape[1])))
        return out
