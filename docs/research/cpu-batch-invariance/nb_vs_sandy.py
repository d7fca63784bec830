"""Does the fixed-order numba kernel (sequential k, separate multiply and add) give bitwise the Sandybridge sgemm's
result? Then decode rows can take a streaming kernel and prompt rows the sgemm, with one result.
Run with OPENBLAS_CORETYPE=Sandybridge. usage: nb_vs_sandy.py K N"""
import sys, time, statistics
sys.path.insert(0, "/work/wt/research")
import numpy as np
from nb_kernel import matmul as nbmm
K, N = map(int, sys.argv[1:3])
rng = np.random.default_rng(6)
W = np.asfortranarray(rng.standard_normal((N, K), dtype=np.float32) * 0.05)
X = rng.standard_normal((64, K), dtype=np.float32)
for M in (1, 2, 3, 8, 64):
    a = nbmm(X[:M], W); b = (np.concatenate([X[:1], X[:1]]) @ W.T)[:1] if M == 1 else X[:M] @ W.T
    print(f"K={K} N={N} M={M}: numba == sandybridge sgemm: {np.array_equal(a, b)} (max|diff| {np.abs(a-b).max():.3g})")
