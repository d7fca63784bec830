"""nb_rows == Sandybridge sgemm bitwise, and its speed vs numpy (gemv for 1 row / sgemm) for decode rows.
Run with OPENBLAS_CORETYPE=Sandybridge. Medians of 15, both arms interleaved."""
import sys, time, statistics
sys.path.insert(0, "/work/wt/research")
import numpy as np
from nb_rows import matmul_rows
rng = np.random.default_rng(8)
for K, N in ((576, 1536), (576, 960), (1536, 576), (896, 4864), (576, 49152)):
    W = np.asfortranarray(rng.standard_normal((N, K), dtype=np.float32) * 0.05)
    line = []
    for M in (1, 2, 4, 8, 16, 64):
        X = rng.standard_normal((M, K), dtype=np.float32)
        blas = (lambda: np.concatenate([X, X]) @ W.T) if M == 1 else (lambda: X @ W.T)
        ref = blas()[:M]; got = matmul_rows(X, W)
        gemv = lambda: X @ W.T  # today's call (gemv for one row)
        ta, tb, tc = [], [], []
        for _ in range(15):
            t = time.perf_counter(); matmul_rows(X, W); ta.append(time.perf_counter() - t)
            t = time.perf_counter(); blas(); tb.append(time.perf_counter() - t)
            t = time.perf_counter(); gemv(); tc.append(time.perf_counter() - t)
        line.append(f"M={M} eq={np.array_equal(got, ref)} nb {statistics.median(ta)*1e3:.2f} / sgemm {statistics.median(tb)*1e3:.2f} / x@w.T {statistics.median(tc)*1e3:.2f} ms")
    print(f"K={K} N={N}: " + "; ".join(line), flush=True)
