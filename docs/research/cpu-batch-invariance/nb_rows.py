"""A streaming kernel for decode rows that gives bitwise the Sandybridge sgemm's result (see emulate_sandy.py):
OpenBLAS's K blocks, in each a sequential sum from 0 of round(x*w), the block sums added in order. Reads each
weight once (like gemv), vectorized over the output columns, threads split the columns."""
import numpy as np
from numba import njit, prange

Q, U = 384, 16

def k_blocks(K):
    out, ls = [0], 0
    while ls < K:
        n = K - ls
        n = Q if n >= 2 * Q else (((n // 2 + U - 1) // U) * U if n > Q else n)
        ls += n; out.append(ls)
    return np.asarray(out, np.int64)

@njit(parallel=True, boundscheck=False)
def _rows(x, wt, out, kb):
    M, K = x.shape
    N = wt.shape[1]
    CH = 512
    for c in prange((N + CH - 1) // CH):
        n0 = c * CH
        nn = min(N, n0 + CH) - n0
        C = np.zeros((M, CH), np.float32)
        acc = np.empty((M, CH), np.float32)
        for b in range(len(kb) - 1):
            acc[:, :] = 0.0
            for k in range(kb[b], kb[b + 1]):
                for r in range(M):
                    xv = x[r, k]
                    for j in range(nn):
                        acc[r, j] += xv * wt[k, n0 + j]
            for r in range(M):
                for j in range(nn):
                    C[r, j] += acc[r, j]
        for r in range(M):
            for j in range(nn):
                out[r, n0 + j] = C[r, j]

_kb = {}
def matmul_rows(x, w):
    K = x.shape[1]
    kb = _kb.get(K)
    if kb is None: kb = _kb[K] = k_blocks(K)
    out = np.empty((x.shape[0], w.shape[0]), np.float32)
    _rows(np.ascontiguousarray(x, dtype=np.float32), w.T, out, kb)
    return out
