"""The CPU's matrix products in an order that does not depend on the step's shape.

NumPy's matmul goes to OpenBLAS, whose default x86-64 kernels (Haswell and later) give a row of
X @ W.T an order of additions that depends on how many rows X has and where the row sits among
them (the micro-kernel's tiles of 12/8/4/2/1 rows accumulate differently; threads split the rows),
and a single row goes to sgemv, another kernel again. With the Sandybridge kernels every tile adds
one k step at a time into one accumulator, so every row of an sgemm of 2 or more rows has the same
bits at any row count, position and thread count (docs/research/cpu-batch-invariance, measured on
every M up to 512 and the heads of both test models). The engine process asks for them before NumPy
loads (`prefer_row_invariant_blas`); `rows_invariant` checks at start that the BLAS in this process
really behaves so (another BLAS, another CPU, a future OpenBLAS may not), and the engine keeps its
fixed shapes when it does not (engine/runner/runner.py, shape_free).

This module imports NumPy only inside `rows_invariant`: `prefer_row_invariant_blas` runs first.
"""
from __future__ import annotations

import os

CORETYPE = "Sandybridge"  # OpenBLAS's kernels whose sgemm rows do not depend on the shape (DYNAMIC_ARCH builds)


def prefer_row_invariant_blas(environ=os.environ) -> None:
    """Ask OpenBLAS for the row-invariant kernels (unless the environment names a core already);
    must run before NumPy is first imported in the process, and is inherited by its children."""
    environ.setdefault("OPENBLAS_CORETYPE", CORETYPE)


def rows_invariant(weights, head_dim: int, key_tile: int, rows: int = 24) -> bool:
    """Whether every row of x @ w.T, for 2 to `rows` rows at any offset, equals the same row inside
    the product of all `rows`, for each of `weights` (the model's matrices, (n, k): OpenBLAS's order
    depends on k, and on n through whether it threads), and the same for attention's stacked
    products over `key_tile` keys of `head_dim` values. Tens of milliseconds at start."""
    import numpy as np

    rng = np.random.default_rng(0)
    products = [(w, rng.standard_normal((rows, w.shape[1]), dtype=np.float32)) for w in weights]
    keys = rng.standard_normal((2, key_tile, head_dim), dtype=np.float32).transpose(0, 2, 1)  # (2, d, tile)
    probs = rng.random((2, rows, key_tile), dtype=np.float32)
    values = rng.standard_normal((2, key_tile, head_dim), dtype=np.float32)
    q = rng.standard_normal((2, rows, head_dim), dtype=np.float32)
    cases = [(lambda part, w=w, x=x: x[part] @ w.T) for w, x in products]
    cases += [lambda part: q[:, part] @ keys, lambda part: probs[:, part] @ values]
    for case in cases:
        whole = case(slice(None))
        axis = whole.ndim - 2  # the rows' axis
        for n in (2, 3, 5, 13):
            for offset in (0, 1, rows - n):
                part = slice(offset, offset + n)
                if not np.array_equal(case(part), whole[(slice(None),) * axis + (part,)]):
                    return False
    return True
