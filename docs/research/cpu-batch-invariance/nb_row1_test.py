import sys, time, statistics
sys.path.insert(0, "/work/wt/research")
import numpy as np
from nb_row1 import matmul_row
rng = np.random.default_rng(10)
for K, N in ((576, 960), (576, 3072), (1536, 576), (576, 49152), (896, 4864)):
    W = np.asfortranarray(rng.standard_normal((N, K), dtype=np.float32) * 0.05)
    X = rng.standard_normal((1, K), dtype=np.float32)
    eq = np.array_equal(matmul_row(X, W), (np.concatenate([X, X]) @ W.T)[:1])
    ta, tb, tc = [], [], []
    for _ in range(21):
        t = time.perf_counter(); matmul_row(X, W); ta.append(time.perf_counter() - t)
        t = time.perf_counter(); X @ W.T; tb.append(time.perf_counter() - t)
        t = time.perf_counter(); np.concatenate([X, X]) @ W.T; tc.append(time.perf_counter() - t)
    m = lambda v: statistics.median(v) * 1e3
    print(f"K={K} N={N}: equal to Sandybridge sgemm {eq}; numba row {m(ta):.3f} ms, x@w.T (gemv) {m(tb):.3f} ms, padded sgemm {m(tc):.3f} ms")
