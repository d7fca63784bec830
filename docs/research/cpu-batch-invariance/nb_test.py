"""Invariance and speed of nb_kernel vs x @ w.T. usage: nb_test.py K N MMAX"""
import sys, time
import numpy as np
sys.path.insert(0, "/work/wt/research")
from nb_kernel import matmul, mm_strict, mm_contract
K, N, MMAX = map(int, sys.argv[1:4])
rng = np.random.default_rng(2)
W = np.asfortranarray(rng.standard_normal((N, K), dtype=np.float32) * 0.05)
X = rng.standard_normal((MMAX, K), dtype=np.float32)
for name, kern in (("strict", mm_strict), ("contract", mm_contract)):
    ref = matmul(X, W, kern)
    one = np.concatenate([matmul(X[i:i + 1], W, kern) for i in range(MMAX)])
    bad_m = [M for M in range(1, MMAX + 1) if not np.array_equal(matmul(X[:M], W, kern), ref[:M])]
    bad_p = sum(not np.array_equal(matmul(X[p], W, kern), ref[p]) for p in (rng.permutation(MMAX) for _ in range(5)))
    x64 = X.astype(np.float64) @ W.T.astype(np.float64)
    print(f"{name} K={K} N={N}: alone==in-batch {np.array_equal(ref, one)}, M differing {len(bad_m)}, perms differing {bad_p}/5, "
          f"max|diff| vs BLAS {np.abs(ref - X @ W.T).max():.3g}, vs f64 {np.abs(ref - x64).max():.3g} (BLAS vs f64 {np.abs(X @ W.T - x64).max():.3g})")
