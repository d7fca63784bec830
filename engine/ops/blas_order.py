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
    """Ask OpenBLAS for the row-invariant kernels (unless the environment names a core already), and
    cuBLAS for no workspace: without one it never splits a GEMM's k by the row count (with one, the
    8B shape's wo and ffn_down rows changed bits below 41 and 331 rows; without, no row of 1 to 4096
    did, at the same speed: bench/results/prompt_gemm_probe_h200.json). Must run before NumPy and
    CuPy are first imported in the process; inherited by its children."""
    environ.setdefault("OPENBLAS_CORETYPE", CORETYPE)
    environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":0:0")


def same_rows(products, rows: int, sizes=(2, 3, 5, 13)) -> bool:
    """Whether each product (part: a slice of `rows` input rows -> their output rows, stacked along
    the second-to-last axis) gives every row of a part of `sizes` rows, at offsets 0, 1 and the end,
    the bits it has in the product of all `rows`. NumPy or CuPy arrays."""
    for product in products:
        whole = product(slice(None))
        lead = (slice(None),) * (whole.ndim - 2)
        for n in sizes:
            for offset in (0, 1, rows - n):
                part = slice(offset, offset + n)
                if not bool((product(part) == whole[(*lead, part)]).all()):
                    return False
    return True


def rows_invariant(weights, head_dim: int, key_tile: int, rows: int = 24) -> bool:
    """The CPU's check: same_rows for x @ w.T over each of `weights` (the model's matrices, (n, k):
    OpenBLAS's order depends on k, and on n through whether it threads), and for attention's stacked
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
    return same_rows(cases, rows)
