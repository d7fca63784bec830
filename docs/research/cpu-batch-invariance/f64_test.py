"""Option (c): float64 accumulation rounded to float32. dgemm's order changes with M exactly like sgemm's; how
often does the float32 rounding of two float64 results for the same row differ? usage: f64_test.py K N"""
import sys
import numpy as np
K, N = map(int, sys.argv[1:3])
rng = np.random.default_rng(4)
W = rng.standard_normal((N, K)) * 0.05  # float64
W32 = W.astype(np.float32); W64 = np.asfortranarray(W32.astype(np.float64))
X = rng.standard_normal((512, K)).astype(np.float32).astype(np.float64)
ref = (X @ W64.T)  # f64 inside M=512
tot = flips32 = diff64 = 0
for M in (2, 3, 5, 7, 13, 17, 31, 64, 100, 255):
    y = X[:M] @ W64.T
    diff64 += int(np.sum(y != ref[:M])); tot += y.size
    flips32 += int(np.sum(y.astype(np.float32) != ref[:M].astype(np.float32)))
print(f"K={K} N={N}: {tot} outputs, float64 results differing bitwise {diff64} ({diff64/tot:.3f}), "
      f"float32-rounded differing {flips32} ({flips32/tot:.2e}, 1 in {tot/max(flips32,1):.3g})")
