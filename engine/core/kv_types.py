"""The KV cache's element types (engine --kv-type):

  auto   the backend's own float type: float32 on the CPU, float16 on the GPU (the default)
  f32    float32 (the CPU only: the GPU's kernels read float16)
  f16    float16 (2 bytes a value; on the CPU, rows are widened to float32 where attention reads them)
  q8_0   llama.cpp's 8-bit blocks: each run of 32 values of a row is 32 int8 and one float16 scale
         (34 bytes per 32 values, 0.53x float16's size); quantized as rows are written. The CPU widens
         rows to float32 where attention reads them; on the GPU the decode kernel reads the 8-bit rows
         themselves and a prompt chunk's attention reads its sequence's rows widened to float16
         (engine/kernels/attention.cu).

A q8_0 pool is a Q8Array: the int8 values and the scales side by side, indexed and assigned as one
array over the leading axes (the last axis, a head's values, is never indexed). Copies (snapshots,
host-tier blocks) carry the quantized form as it is, so a parked read resumes on exactly the rows it
wrote.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass

import numpy as np

KV_TYPES = ("auto", "f32", "f16", "q8_0")
Q8_GROUP = 32  # values per scale


def quantize_q8_0(x, xp=np) -> tuple[object, object]:
    """x: (..., d) floats, d a multiple of 32 -> (q int8 (..., d), scale float16 (..., d/32)).
    Each group's scale is its largest magnitude / 127 (as llama.cpp's q8_0), rounded to float16;
    the values are rounded against that float16 scale, so that q * scale is what is stored."""
    *lead, d = x.shape
    groups = x.reshape(*lead, d // Q8_GROUP, Q8_GROUP).astype(xp.float32)
    scale = (xp.abs(groups).max(axis=-1) / 127).astype(xp.float16)  # (..., d/32)
    wide = scale.astype(xp.float32)[..., None]
    inverse = xp.divide(1, wide, out=xp.zeros_like(wide), where=wide != 0)
    q = xp.clip(xp.rint(groups * inverse), -127, 127).astype(xp.int8)
    return q.reshape(*lead, d), scale


def dequantize_q8_0(q, scale, xp=np):
    """(..., d) int8 and (..., d/32) float16 -> (..., d) float32."""
    *lead, d = q.shape
    groups = q.reshape(*lead, d // Q8_GROUP, Q8_GROUP).astype(xp.float32) * scale.astype(xp.float32)[..., None]
    return groups.reshape(*lead, d)


@dataclass
class Q8Array:
    """q: (..., d) int8; scale: (..., d/32) float16, same leading axes."""

    q: object
    scale: object

    @classmethod
    def zeros(cls, shape: tuple[int, ...], xp=np) -> "Q8Array":
        if shape[-1] % Q8_GROUP:
            raise ValueError(f"q8_0 needs a head size that is a multiple of {Q8_GROUP}, not {shape[-1]}")
        return cls(xp.zeros(shape, dtype=xp.int8), xp.zeros((*shape[:-1], shape[-1] // Q8_GROUP), dtype=xp.float16))

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.q.shape)

    @property
    def nbytes(self) -> int:
        return int(self.q.nbytes + self.scale.nbytes)

    def __getitem__(self, index) -> "Q8Array":
        return Q8Array(self.q[index], self.scale[index])

    def __setitem__(self, index, value) -> None:
        """A Q8Array is copied as it is; floats (..., d) are quantized first."""
        if not isinstance(value, Q8Array):
            value = Q8Array(*quantize_q8_0(value, array_module(self.q)))
        self.q[index] = value.q
        self.scale[index] = value.scale

    def map(self, fn) -> "Q8Array":
        """fn applied to both parts (a copy to the host or to the device)."""
        return Q8Array(fn(self.q), fn(self.scale))

    def dequantize(self):
        return dequantize_q8_0(self.q, self.scale, array_module(self.q))


def array_module(array):
    """numpy, or cupy for a device array (cupy is then already imported, by engine/ops/backend.py)."""
    cupy = sys.modules.get("cupy")
    return np if cupy is None else cupy.get_array_module(array)


def widened(rows):
    """Rows read from a pool as floats attention can use: a Q8Array dequantized, others as they are."""
    return rows.dequantize() if isinstance(rows, Q8Array) else rows


@dataclass(frozen=True)
class KVType:
    """One element type of the pool: its name as INFO reports it, the bytes a value takes, and the
    float pool's dtype (None: q8_0's Q8Array)."""

    name: str
    value_bytes: float
    dtype: object | None

    def zeros(self, shape: tuple[int, ...], xp=np):
        return Q8Array.zeros(shape, xp) if self.dtype is None else xp.zeros(shape, dtype=self.dtype)


TYPES = {"f32": KVType("f32", 4, np.float32), "f16": KVType("f16", 2, np.float16),
         "q8_0": KVType("q8_0", (Q8_GROUP + 2) / Q8_GROUP, None)}


def resolve(kv_type: str, backend_dtype) -> KVType:
    """--kv-type's value as the pool's type: auto is the backend's own float type."""
    if kv_type == "auto":
        return next(t for t in TYPES.values() if t.dtype == np.dtype(backend_dtype))
    return TYPES[kv_type]


def check_kv_type(kv_type: str, backend_name: str, head_dim: int) -> None:
    """A clear refusal of a type the backend or the model cannot hold (also for an EngineConfig
    made in code, which argparse's choices never saw)."""
    if kv_type not in KV_TYPES:
        raise ValueError(f"--kv-type {kv_type!r}: choose one of {', '.join(KV_TYPES)}")
    if backend_name == "gpu" and kv_type == "f32":
        raise ValueError("--kv-type f32 is not available on the GPU (its attention kernels read float16 or q8_0): "
                         "use --kv-type f16 (the GPU's default) or q8_0, or --device cpu")
    if kv_type == "q8_0" and head_dim % Q8_GROUP:
        raise ValueError(f"--kv-type q8_0 needs a head size that is a multiple of {Q8_GROUP}; this model's is {head_dim}")
