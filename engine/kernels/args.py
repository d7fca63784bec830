"""Kernel arguments that several launchers pass alike: a null pointer, an array's address, the Q8 units and Q8K
super-blocks a kernel writes beside its fp16 rows, a KV block size as its exponent, a layer's K and V pools."""
from __future__ import annotations

import numpy as np

from engine.core.kv_types import Q8Array
from engine.core.quantized import UNIT
from engine.kernels.limits import Q8_BYTES, Q8K_BYTES

NULL = np.uint64(0)  # a null pointer argument


def address(a) -> int:
    """A device array's address (a host array's where the caller runs the kernels on the CPU: tests)."""
    return a.data.ptr if hasattr(a.data, "ptr") else a.ctypes.data


def or_null(a):
    """An optional array as a kernel's pointer argument: the array, or NULL where there is none."""
    return NULL if a is None else a


def q8_units(cp, values: int, q8: bool = True):
    """Room for the Q8 units (q8.cuh: values / 32 of them) of `values` fp16 values that a kernel writes beside them;
    None without q8 (the kernel then gets NULL)."""
    return cp.empty((values // UNIT, Q8_BYTES), dtype=cp.uint8) if q8 else None


def q8k_blocks(cp, rows: int, width: int, wanted: bool):
    """Room for the Q8K super-blocks (q8k.cuh: 288 bytes a 256 values) of `rows` rows of `width` fp16 values that a
    kernel writes beside them where sbq.cu's matvecs read the rows (wanted) and the width is whole super-blocks; None
    otherwise (the kernel gets NULL, and the matvec quantizes the rows itself)."""
    return cp.empty((rows, width // 256, Q8K_BYTES), dtype=cp.uint8) if wanted and width % 256 == 0 else None


def log2(block: int) -> np.int32:
    """A KV block size's exponent (block sizes are powers of two: engine/cli.py)."""
    return np.int32(block.bit_length() - 1)


def pool_args(k_cache, v_cache) -> tuple:
    """A layer's K and V pools as the kernels take them: the values, then the q8_0 scales (null for fp16)."""
    if isinstance(k_cache, Q8Array):
        return k_cache.q, v_cache.q, k_cache.scale, v_cache.scale
    return k_cache, v_cache, NULL, NULL
