"""Emulate the Sandybridge sgemm's order for one element: K cut into OpenBLAS's K blocks (GEMM_Q=384 for
Sandybridge: K <= Q one block; Q < K < 2Q two halves rounded up to UNROLL_M=16; else Q-blocks), in each block a
sequential sum from 0 of round(x*w) (mul then add), the block sums added into C in order (C = 1*acc + C).
Compare bitwise with the library. Run with OPENBLAS_CORETYPE=Sandybridge."""
import sys
import numpy as np
Q, U = 384, 16
def blocks(K):
    out, ls = [], 0
    while ls < K:
        min_l = K - ls
        if min_l >= 2 * Q: min_l = Q
        elif min_l > Q: min_l = ((min_l // 2 + U - 1) // U) * U
        out.append((ls, ls + min_l)); ls += min_l
    return out
def emulate(x, wt):  # x (M, K), wt (K, N)
    C = np.zeros((x.shape[0], wt.shape[1]), np.float32)
    for a, b in blocks(x.shape[1]):
        acc = np.zeros_like(C)
        for k in range(a, b):
            acc += x[:, k:k + 1] * wt[k]  # float32: round(x*w) then round(acc + .)
        C += acc
    return C
rng = np.random.default_rng(6)
for K, N in ((576, 1536), (896, 4864), (1536, 576), (2560, 960), (4864, 896), (64, 700), (300, 64)):
    W = np.asfortranarray(rng.standard_normal((N, K), dtype=np.float32) * 0.05)
    X = rng.standard_normal((8, K), dtype=np.float32)
    e = emulate(X, W.T)
    print(f"K={K} N={N} blocks {blocks(K)}: emulation == sgemm (M=8) {np.array_equal(e, X @ W.T)}")
