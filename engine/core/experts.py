"""A mixture-of-experts layer's weights as the GGUF stacks them: what the loader fills
(engine/model/weights.py), the NumPy path computes with (engine/ops/moe.py) and the GPU kernels read
(engine/kernels/moe.py)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ExpertStack:
    """One of a layer's stacked expert tensors (ffn_{gate,up,down}_exps) as GGUF stores it: expert
    e's (rows, cols) matrix is rows e*rows .. (e+1)*rows of `data`, which holds blocks of one type
    ((experts*rows, row bytes) uint8, kept on the GPU as the file has them) or values ((experts*rows,
    cols): float32 on the CPU, fp16 on the GPU)."""

    kind: str  # a GGUF block type (engine/core/quantized.py BLOCKS), "F16" or "F32"
    data: object
    experts: int
    rows: int
    cols: int
    table: object = None  # on a GPU, expert e's rows' device address (experts,) uint64, where moe.cu's kernels read
    # them: an expert cache's (a slot, or page-locked host memory); None: in `data` (MoeKernels.table)

    @property
    def expert_bytes(self) -> int:
        """One expert's matrix in bytes (its rows as stored)."""
        return self.rows * int(self.data[:1].nbytes)

    def expert(self, e: int):
        """Expert e's matrix (rows, cols), of a stack of values."""
        return self.data[e * self.rows : (e + 1) * self.rows]


@dataclass(frozen=True)
class Experts:
    gate: ExpertStack  # (experts, expert_ffn, dim)
    up: ExpertStack  # (experts, expert_ffn, dim)
    down: ExpertStack  # (experts, dim, expert_ffn)
