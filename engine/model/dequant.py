"""GGUF quantized blocks -> float32 on the host, the CPU's weights (engine/model/weights.py).

Each type does the `gguf` package's arithmetic (gguf/quants.py), the same float32 operations in the
same order for every value, so its values bit for bit (tests/engine/model/test_dequant.py), but over
thousands of rows at a time written straight into the destination (column-major on the CPU):
`gguf.quants.dequantize` works 16 rows at a time and its result is copied twice more, ~7x slower.
"""
from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType
from gguf.quants import dequantize as gguf_dequantize

F32 = np.float32
CHUNK_VALUES = 1 << 17  # values expanded at a time: a chunk's temporaries stay in the cache
MIN_ROWS = 64  # but rows of at least this many: the CPU's weights are column-major (host_matrix), so a chunk's
# rows are written as runs of this many floats per column (16 rows: 0.75 GB/s; 64: 1.8 GB/s)


def scale(blocks: np.ndarray, at: int) -> np.ndarray:
    """The fp16 at bytes at, at+1 of each block as float32, (n, 1)."""
    return blocks[:, at:at + 2].view(np.float16).astype(F32)


def times(d: np.ndarray, q: np.ndarray) -> np.ndarray:
    """d * q in float32, q's integers widened inside the multiply (exact, as .astype(float32) is, and
    ~4x faster than a separate astype pass from 8-bit integers)."""
    return np.multiply(d, q, dtype=F32)


def nibbles(qs: np.ndarray) -> np.ndarray:
    """(n, ..., k) bytes -> (n, ..., 2, k): their low nibbles, then their high ones."""
    out = np.empty((*qs.shape[:-1], 2, qs.shape[-1]), np.uint8)
    np.bitwise_and(qs, 15, out=out[..., 0, :])
    np.right_shift(qs, 4, out=out[..., 1, :])
    return out


def bits(qh: np.ndarray) -> np.ndarray:
    """(n, k) bytes -> (n, 8, k): bit i of each byte in row i."""
    return np.unpackbits(qh[:, None, :], axis=1, count=8, bitorder="little")


def q4_0(b: np.ndarray) -> np.ndarray:  # d (2) | 16 bytes of nibbles: d * (q - 8)
    q = nibbles(b[:, 2:18]).reshape(len(b), 32).view(np.int8) - np.int8(8)
    return times(scale(b, 0), q)


def q4_1(b: np.ndarray) -> np.ndarray:  # d (2) | m (2) | 16 bytes of nibbles: d * q + m
    out = times(scale(b, 0), nibbles(b[:, 4:20]).reshape(len(b), 32))
    return np.add(out, scale(b, 2), out=out)


def high_bits(qh: np.ndarray) -> np.ndarray:
    """A Q5 block's 4 bytes of fifth bits (a little-endian uint32: bit j is value j's) as (n, 32) 0/16."""
    return np.unpackbits(qh, axis=1, bitorder="little") << np.uint8(4)


def q5_0(b: np.ndarray) -> np.ndarray:  # d (2) | qh (4) | 16 bytes of nibbles: d * (q - 16)
    q = (nibbles(b[:, 6:22]).reshape(len(b), 32) | high_bits(b[:, 2:6])).view(np.int8) - np.int8(16)
    return times(scale(b, 0), q)


def q5_1(b: np.ndarray) -> np.ndarray:  # d (2) | m (2) | qh (4) | 16 bytes of nibbles: d * q + m
    out = times(scale(b, 0), nibbles(b[:, 8:24]).reshape(len(b), 32) | high_bits(b[:, 4:8]))
    return np.add(out, scale(b, 2), out=out)


def q8_0(b: np.ndarray) -> np.ndarray:  # d (2) | 32 int8: q * d
    return times(b[:, 2:34].view(np.int8), scale(b, 0))


def k_scales(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K's and Q5_K's 12 bytes of 6-bit scales and mins -> (n, 8, 1) float32 each."""
    d, m, md = s[:, 0:4], s[:, 4:8], s[:, 8:12]
    sc = np.concatenate([d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)], axis=1)
    mn = np.concatenate([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], axis=1)
    return sc.astype(F32)[:, :, None], mn.astype(F32)[:, :, None]


def k_values(b: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Q4_K's and Q5_K's values from their (n, 8, 32) quants: d sc * q - dmin m."""
    sc, mn = k_scales(b[:, 4:16])
    out = times(scale(b, 0)[:, :, None] * sc, q)
    return np.subtract(out, scale(b, 2)[:, :, None] * mn, out=out).reshape(len(b), 256)


def q4_k(b: np.ndarray) -> np.ndarray:  # d | dmin | scales (12) | 128 bytes of nibbles
    return k_values(b, nibbles(b[:, 16:144].reshape(len(b), 4, 32)).reshape(len(b), 8, 32))


def q5_k(b: np.ndarray) -> np.ndarray:  # d | dmin | scales (12) | qh (32) | 128 bytes of nibbles
    low = nibbles(b[:, 48:176].reshape(len(b), 4, 32)).reshape(len(b), 8, 32)
    return k_values(b, low | (bits(b[:, 16:48]) << np.uint8(4)))


def q6_k(b: np.ndarray) -> np.ndarray:  # ql (128) | qh (64) | 16 int8 scales | d: d sc * (q - 32)
    n = len(b)
    d = (scale(b, 208) * b[:, 192:208].view(np.int8).astype(F32))[:, :, None]  # (n, 16, 1)
    low = nibbles(b[:, 0:128].reshape(n, 2, 64)).reshape(n, 8, 32)
    qh = b[:, 128:192].reshape(n, 2, 1, 32) >> np.array([0, 2, 4, 6], dtype=np.uint8)[:, None]
    q = (low | ((qh & np.uint8(3)).reshape(n, 8, 32) << np.uint8(4))).view(np.int8) - np.int8(32)
    return times(d, q.reshape(n, 16, 16)).reshape(n, 256)


# GGUF type -> (values per block, bytes per block, its expansion)
EXPAND = {"Q4_0": (32, 18, q4_0), "Q4_1": (32, 20, q4_1), "Q5_0": (32, 22, q5_0), "Q5_1": (32, 24, q5_1),
          "Q8_0": (32, 34, q8_0), "Q4_K": (256, 144, q4_k), "Q5_K": (256, 176, q5_k), "Q6_K": (256, 210, q6_k)}


def gguf_values(raw: np.ndarray, kind: str) -> np.ndarray:
    """(rows, row bytes) of a type this module lacks -> (rows, cols) float32, by the `gguf` package."""
    return gguf_dequantize(raw, GGMLQuantizationType[kind]).astype(F32, copy=False).reshape(len(raw), -1)


def dequantize_into(raw: np.ndarray, kind: str, out: np.ndarray, cols: tuple[int, int] | None = None) -> None:
    """raw: (rows, row bytes) of one type's blocks -> out (rows, columns lo..hi of cols, or all), any
    memory order. Types this module lacks are the `gguf` package's (F32, F16, BF16, the rare ones)."""
    if kind not in EXPAND:
        values = gguf_values(raw, kind)
        out[...] = values if cols is None else values[:, cols[0]:cols[1]]
        return
    size, nbytes, expand = EXPAND[kind]
    if cols is not None:  # only the blocks holding the columns (a tensor-parallel shard's) are expanded
        first, end = cols[0] // size, -(-cols[1] // size)
        raw, cols = raw[:, first * nbytes:end * nbytes], (cols[0] - first * size, cols[1] - first * size)
    width = raw.shape[1] // nbytes * size
    step = max(MIN_ROWS, CHUNK_VALUES // width)
    for r in range(0, len(raw), step):
        chunk = np.ascontiguousarray(raw[r:r + step])  # (n, row bytes)
        values = expand(chunk.reshape(-1, nbytes)).reshape(len(chunk), width)
        out[r:r + step] = values if cols is None else values[:, cols[0]:cols[1]]


def dequantize(raw: np.ndarray, kind: str) -> np.ndarray:
    """(rows, row bytes) -> (rows, cols) float32, C order."""
    if kind not in EXPAND:
        return gguf_values(raw, kind)
    size, nbytes, _ = EXPAND[kind]
    out = np.empty((len(raw), raw.shape[1] // nbytes * size), F32)
    dequantize_into(raw, kind, out)
    return out
