"""Weights kept in their GGUF block layout on the GPU: a matrix whose rows are quantized blocks.

A GGUF quantized tensor stores each row as whole blocks (32 values, or 256 for the K-quants), so
rows can be permuted and stacked as bytes: the Q/K head reordering and the QKV / gate-up stacking
the forward pass wants work on the blocks as they are. Stacked tensors of different types (a
Q4_K_M file keeps attn_v in Q6_K beside Q4_K attn_q/attn_k) stay as parts, each of one type; the
kernels (engine/kernels/quant.cu) run part by part into the rows of one output.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from engine.core.kv_types import array_module

# GGUF type -> (values per block, bytes per block): the types whose blocks stay on the device
BLOCKS = {"Q4_0": (32, 18), "Q4_1": (32, 20), "Q5_0": (32, 22), "Q5_1": (32, 24), "Q8_0": (32, 34),
          "Q4_K": (256, 144), "Q5_K": (256, 176), "Q6_K": (256, 210),
          "IQ2_XXS": (256, 66), "IQ2_XS": (256, 74), "IQ2_S": (256, 82), "IQ3_XXS": (256, 98), "IQ3_S": (256, 110),
          "IQ4_NL": (32, 18), "IQ4_XS": (256, 136)}
UNIT = 32  # values one kernel thread decodes at a time (a block, or a sub-block of a K-quant)


def quantize_q8(x: np.ndarray) -> np.ndarray:
    """The activation x (k,) as the quantized matvecs see it: per 32 values, d = max |x| / 127 and
    x ~ d * round(x / d) (engine/kernels/quant.cu quantize_q8). Returns those values, float32."""
    units = x.astype(np.float32).reshape(-1, UNIT)
    amax = np.abs(units).max(axis=1, keepdims=True)
    inv = np.divide(np.float32(127), amax, out=np.zeros_like(amax), where=amax > 0)
    return (np.rint(units * inv) * (amax / np.float32(127))).reshape(-1)


def row_bytes(kind: str, cols: int) -> int:
    if kind == "F16":
        return 2 * cols
    size, nbytes = BLOCKS[kind]
    return cols // size * nbytes


@dataclass(frozen=True)
class QuantPart:
    kind: str  # a BLOCKS type, or "F16" (a fallback tensor stacked among quantized ones)
    data: object  # (rows, row_bytes(kind, cols)) uint8, or (rows, cols) float16
    rows: int


@dataclass(frozen=True)
class QuantMatrix:
    """(rows, cols) in the (out_features, in_features) order of every weight here."""

    parts: tuple[QuantPart, ...]
    cols: int

    @property
    def rows(self) -> int:
        return sum(p.rows for p in self.parts)

    @property
    def shape(self) -> tuple[int, int]:
        return self.rows, self.cols

    @property
    def nbytes(self) -> int:
        return sum(int(p.data.nbytes) for p in self.parts)

    def row_range(self, start: int, stop: int) -> "QuantMatrix":
        """Rows start..stop-1: each part's rows in that range (views of the same blocks)."""
        parts, first = [], 0
        for p in self.parts:
            lo, hi = max(start, first), min(stop, first + p.rows)
            if lo < hi:
                parts.append(QuantPart(p.kind, p.data[lo - first:hi - first], hi - lo))
            first += p.rows
        return QuantMatrix(tuple(parts), self.cols)

    def col_range(self, start: int, stop: int) -> "QuantMatrix":
        """Columns start..stop-1 of every row: whole blocks (the range must begin and end on a block
        boundary of every part's type), copied contiguous."""
        parts = []
        for p in self.parts:
            size = 1 if p.kind == "F16" else BLOCKS[p.kind][0]
            if start % size or stop % size:
                raise ValueError(f"columns {start}..{stop} cut {p.kind}'s blocks of {size} values")
            lo, hi = (start, stop) if p.kind == "F16" else (row_bytes(p.kind, start), row_bytes(p.kind, stop))
            parts.append(QuantPart(p.kind, p.data[:, lo:hi].copy(), p.rows))
        return QuantMatrix(tuple(parts), stop - start)


def concat_rows(matrices: list[QuantMatrix]) -> QuantMatrix:
    """Matrices of the same width, one under the other; adjacent parts of one type joined into one
    (one kernel launch, as stack_rows makes them)."""
    parts: list[QuantPart] = []
    for p in (p for m in matrices for p in m.parts):
        if parts and parts[-1].kind == p.kind:
            last = parts.pop()
            p = QuantPart(p.kind, array_module(p.data).concatenate([last.data, p.data]), last.rows + p.rows)
        parts.append(p)
    return QuantMatrix(tuple(parts), matrices[0].cols)


@dataclass(frozen=True)
class Row8:
    """A decode step's activation rows (n, k) fp16 with their 8-bit form (n k / 32 Q8 units, row by
    row, kernels/q8.cuh): the step's quantized matvecs read the latter, written by the kernel that
    produced the rows."""

    values: object
    q8: object
    q8k: object = None  # (n, k / 256, 288) bytes: the rows' Q8K super-blocks (kernels/q8k.cuh) for sbq.cu's matvecs,
    # where the producer wrote them too ($STRATA_SBQ=1), else None

    def row(self, i: int) -> "Row8":
        """Row i alone: its values and its units (views)."""
        return self.rows(slice(i, i + 1))

    def rows(self, part: slice) -> "Row8":
        """Consecutive rows part.start .. part.stop (a slice of step 1): their values and their units (views)."""
        units = self.q8.shape[0] // self.values.shape[0]
        start, stop, _ = part.indices(self.values.shape[0])
        return Row8(self.values[start:stop], self.q8[start * units : stop * units],
                    None if self.q8k is None else self.q8k[start:stop])


@dataclass(frozen=True)
class HostRows:
    """One tensor's rows as stored in the file (before upload): blocks (rows, row_bytes) uint8,
    or float16 (rows, cols) values."""

    kind: str
    data: np.ndarray
    cols: int


def stack_rows(pieces: list[HostRows], upload) -> QuantMatrix:
    """Stack tensors' rows (QKV, gate-up) into one matrix: adjacent pieces of one type become one
    part (one kernel launch); upload(arrays) -> the arrays' rows stacked on the device (one array)."""
    groups: list[list[HostRows]] = []
    for p in pieces:
        if groups and groups[-1][0].kind == p.kind:
            groups[-1].append(p)
        else:
            groups.append([p])
    return QuantMatrix(tuple(QuantPart(g[0].kind, upload([p.data for p in g]), sum(int(p.data.shape[0]) for p in g))
                             for g in groups), pieces[0].cols)
