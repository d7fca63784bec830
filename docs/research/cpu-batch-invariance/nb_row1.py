"""One decode row, the Sandybridge sgemm's order (K blocks, sequential mul-then-add, block sums added), written so
LLVM vectorizes the column loop: a 1-D accumulator per column chunk."""
import numpy as np
from numba import njit, prange
from nb_rows import k_blocks

@njit(parallel=True, boundscheck=False)
def _row(x, wt, out, kb):
    K = x.shape[0]; N = wt.shape[1]; CH = 1024
    for c in prange((N + CH - 1) // CH):
        n0 = c * CH; n1 = min(N, n0 + CH)
        nn = n1 - n0
        C = np.zeros(nn, np.float32)
        acc = np.empty(nn, np.float32)
        for b in range(len(kb) - 1):
            acc[:] = 0.0
            for k in range(kb[b], kb[b + 1]):
                xv = x[k]
                w = wt[k, n0:n1]
                for j in range(nn):  # no temporary; a 1-D view so the loop vectorizes (no reassociation needed)
                    acc[j] += xv * w[j]
            for j in range(nn):
                C[j] += acc[j]
        for j in range(nn):
            out[n0 + j] = C[j]

def matmul_row(x, w, _kb={}):
    K = x.shape[-1]
    kb = _kb.get(K)
    if kb is None: kb = _kb[K] = k_blocks(K)
    out = np.empty(w.shape[0], np.float32)
    _row(np.ascontiguousarray(x.reshape(-1), dtype=np.float32), w.T, out, kb)
    return out[None]
