"""Launchers of quant.cu's dequant_ and embed_ kernels: quantized weights expanded to fp16 at load
(dequantize), a quantized matrix into the scratch for a prompt chunk's GEMM (expand), a table's rows
(embed)."""
from __future__ import annotations

from types import ModuleType
from typing import Callable

import numpy as np

from engine.core.quantized import BLOCKS, UNIT, QuantMatrix
from engine.kernels.limits import THREADS, blocks

WEIGHT_KINDS = (*BLOCKS, "F16")  # each has dequant_ and embed_ kernels in quant.cu; the blocks matvec_ ones
# too, and fp16 weights the tensor-core mmv_f16_ kernels of mmv.cu
DEQUANT = (*BLOCKS, "BF16")  # the GGUF types the device expands to fp16 itself


class DequantLaunchers:
    """Mixed into GpuKernels, which sets what these read: cp (CuPy), fn (kernel name -> function),
    scratch (reserve_scratch's buffer), kept (id of a matrix -> the matrix and its expansion, keep's: empty unless
    prompt weights are kept), parts (MatvecLaunchers.parts: a weight's parts)."""

    cp: ModuleType
    fn: dict
    scratch: object
    kept: dict
    parts: Callable

    def embed(self, table: QuantMatrix, tokens):
        """Rows `tokens` (n,) of a quantized (vocab, dim) table -> (n, dim) fp32."""
        (part,) = table.parts
        ids = self.cp.asarray(tokens, dtype=self.cp.int64)
        out = self.cp.empty((ids.shape[0], table.cols), dtype=self.cp.float32)
        units = out.size // UNIT
        self.fn[f"embed_{part.kind}"](blocks(units), (THREADS,), (part.data, ids, out, np.int64(units),
                                                                  np.int32(table.cols)))
        return out

    def reserve_scratch(self, values: int) -> None:
        """Room for the largest quantized matrix in fp16, allocated once at load."""
        if self.scratch is None or self.scratch.size < values:
            self.scratch = None
            self.scratch = self.cp.empty(values, dtype=self.cp.float16)

    def expand(self, w: QuantMatrix):
        """A quantized matrix -> (rows, cols) fp16: its expansion kept at start (keep), else expanded into the
        scratch (valid until the next expand)."""
        kept = self.kept.get(id(w))
        if kept is not None and kept[0] is w:  # (the matrix is held with it: its id is never another's)
            return kept[1]
        return self._expand_into(w, self.scratch[: w.rows * w.cols].reshape(w.rows, w.cols))

    def keep(self, w: QuantMatrix) -> None:
        """w expanded once into memory of its own, which every later expand(w) returns: the same values bit for bit
        (engine/kvcache/prompt_weights.py)."""
        self.kept[id(w)] = (w, self._expand_into(w, self.cp.empty((w.rows, w.cols), dtype=self.cp.float16)))

    def _expand_into(self, w: QuantMatrix, out):
        row = 0
        for kind, data, rows in self.parts(w):
            units = rows * w.cols // UNIT
            self.fn[f"dequant_{kind}"](blocks(units), (THREADS,), (data, out[row:], np.int64(units), np.int32(w.cols)))
            row += rows
        return out

    # ------------------------------------------------------------ load-time dequantization

    def dequantize(self, raw, type_name: str, shape: tuple[int, int]):
        """raw: the tensor's GGUF bytes (a host array, e.g. the memory-mapped file) -> (rows, cols)
        fp16 on the device. Only the raw bytes cross the bus."""
        src = self.cp.asarray(np.ascontiguousarray(raw))
        out = self.cp.empty(shape, dtype=self.cp.float16)
        if type_name == "BF16":
            self.fn["dequant_BF16"](blocks(out.size), (THREADS,), (src, out, np.int64(out.size)))
        else:
            units = out.size // UNIT
            self.fn[f"dequant_{type_name}"](blocks(units), (THREADS,), (src, out, np.int64(units), np.int32(shape[1])))
        return out
