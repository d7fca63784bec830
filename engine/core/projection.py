"""A layer's output projection not yet taken (Projection): its rows times a weight, added to the residual stream
at the next norm. On a GPU a decode row's projection and that norm are one kernel (quant.cu's matvec_norm);
elsewhere the norm takes the product first (ArrayOps.product), as it always did."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Projection:
    """rows (n, k) @ weight (m, k)^T, an (n, m) delta for the residual stream: the attention's output and the
    output matrix, or SwiGLU's and the down matrix. rows may be a Row8 (a GPU decode step's)."""

    rows: object
    weight: object
