"""The start-up check that lets reads share a step: every row of the model's matrix products has the
same bits whatever the rows beside it (engine/ops/blas_order.py says why a BLAS may not). On the CPU,
NumPy's products over the model's matrices and attention's tiles; on the GPU, the prompt path's
products (cuBLAS over the fp16 weights, or their expansion) over the first layer's matrices, for 1 to
333 rows against 512; the kernels of this project are checked by tools/device/ (their orders are
fixed by construction)."""
from __future__ import annotations

import sys

import numpy as np

from engine.core.step import Step
from engine.model.forward import LlamaModel
from engine.ops.backend import KEY_TILE, Backend
from engine.ops.blas_order import same_rows
from engine.ops.blas_order import rows_invariant as cpu_rows_invariant

GPU_ROWS, GPU_SIZES = 512, (1, 2, 3, 5, 13, 40, 100, 333)


def rows_invariant(model: LlamaModel, backend: Backend) -> bool:
    layer = model.w.layers[0]
    linear = [layer.linear.w_in, layer.linear.w_out] if layer.linear is not None else []  # a hybrid's first layer
    # (its delta rule's products have one shape whatever the step: engine/ops/delta_rule.py)
    dense = [w for w in (layer.wqkv, layer.wo, *linear, layer.w_gate_up, layer.w_down) if w is not None]
    if backend.name == "cpu":
        mats = dense if layer.experts is None else dense + [layer.router] + [
            part.expert(0) for part in (layer.experts.gate, layer.experts.up, layer.experts.down)]
        return cpu_rows_invariant([m[:4096] for m in (*mats, model.w.head)], model.cfg.head_dim, KEY_TILE)
    ops, xp = backend.ops, backend.xp
    ops.begin(Step(2, 0, spans=((0, 2),)))  # prompt rows: the products a prompt step makes
    rng = np.random.default_rng(0)
    products = []
    for w in dense:
        x = xp.asarray(rng.standard_normal((GPU_ROWS, w.shape[1])).astype(np.float16))

        def product(part, w=w, x=x):
            return ops.matmul(x[part], w).copy()  # a copy: a quantized weight's scratch is reused

        products.append(product)
    return same_rows(products, GPU_ROWS, GPU_SIZES)


def rows_invariant_said(model: LlamaModel, backend: Backend) -> bool:
    """rows_invariant, and when it is not so, the log says what that costs."""
    if rows_invariant(model, backend):
        return True
    print("strata: this device's matrix products order a row's sums by the product's shape: reads take "
          "a step each and prefixes are reused at whole chunks", file=sys.stderr, flush=True)
    return False
