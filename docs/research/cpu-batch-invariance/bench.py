"""Median time of one (M, K) x (K, N) product per method. usage: bench.py METHOD [reps]
METHOD: blas (x @ w.T as today; OPENBLAS_CORETYPE from env), pad2 (as blas, one row padded to 2),
tile8 / tile4 (stacked fixed tiles), f64 (float64 weights and activations, rounded to f32),
numba (nb_kernel strict), q8 (option b: 8-bit activations x 4-bit weight integers per 32-block, exact
block sums by a batched sgemm, scales combined in a fixed order)."""
import os, sys, time, statistics
import numpy as np
sys.path.insert(0, "/work/wt/research")
meth = sys.argv[1]; reps = int(sys.argv[2]) if len(sys.argv) > 2 else 7
shapes = [(576, 1536), (896, 4864), (576, 49152)][: int(os.environ.get("NSHAPES", "3"))]
Ms = [1, 4, 16, 64, 256, 512]
rng = np.random.default_rng(3)

def tiled(x, w, T):
    n = x.shape[0]; b = -(-n // T)
    if b * T != n:
        xp = np.zeros((b * T, x.shape[1]), np.float32); xp[:n] = x
    else:
        xp = x
    return (xp.reshape(b, T, -1) @ w.T).reshape(b * T, -1)[:n]

def q8_prep(w):  # Q4_1-like: w = d*q + m per 32-block, q in 0..15
    N, K = w.shape; wb = w.reshape(N, K // 32, 32)
    lo, hi = wb.min(-1), wb.max(-1); d = (hi - lo) / 15; d[d == 0] = 1
    q = np.clip(np.rint((wb - lo[..., None]) / d[..., None]), 0, 15).astype(np.float32)
    return np.ascontiguousarray(q.transpose(1, 2, 0)), d.T.copy(), lo.T.copy()  # (nb, 32, N), (nb, N), (nb, N)

def q8_mm(x, prep):
    qT, d, m = prep; M, K = x.shape; nb = K // 32
    xb = x.reshape(M, nb, 32)
    dx = np.abs(xb).max(-1) / 127; dx[dx == 0] = 1
    xq = np.rint(xb / dx[..., None]).astype(np.float32)  # (M, nb, 32) integers in [-127, 127]
    S = np.ascontiguousarray(xq.transpose(1, 0, 2)) @ qT  # (nb, M, N): exact integer sums (< 2^24)
    sx = xq.sum(-1)  # (M, nb) exact
    out = np.zeros((M, d.shape[1]), np.float32)
    for b in range(nb):  # fixed order over blocks, elementwise only
        out += dx[:, b, None] * (S[b] * d[b] + sx[:, b, None] * m[b])
    return out

if meth == "numba":
    from nb_kernel import matmul as nbmm
    nbmm(np.ones((5, 64), np.float32), np.ones((40, 64), np.float32, order="F"))
for K, N in shapes:
    w = np.asfortranarray(rng.standard_normal((N, K), dtype=np.float32) * 0.05)
    if meth == "f64": w64 = np.asfortranarray(w.astype(np.float64))
    if meth == "q8": prep = q8_prep(w)
    res = []
    for M in Ms:
        x = rng.standard_normal((M, K), dtype=np.float32)
        if meth == "blas": f = lambda: x @ w.T
        elif meth == "pad2": f = (lambda: np.concatenate([x, x]) @ w.T) if M == 1 else (lambda: x @ w.T)
        elif meth.startswith("tile"): T = int(meth[4:]); f = lambda: tiled(x, w, T)
        elif meth == "f64": f = lambda: (x.astype(np.float64) @ w64.T).astype(np.float32)
        elif meth == "numba": f = lambda: nbmm(x, w)
        elif meth == "q8": f = lambda: q8_mm(x, prep)
        if meth == "q8" and N * M > 64 * 49152: res.append(f"M={M}: skip"); continue
        f(); ts = []
        budget = time.time() + 6
        for _ in range(reps):
            t = time.perf_counter(); f(); ts.append(time.perf_counter() - t)
            if time.time() > budget and len(ts) >= 3: break
        med = statistics.median(ts)
        res.append(f"M={M}: {med*1e3:.2f}ms ({2*M*K*N/med/1e9:.1f} GF/s)")
    print(f"{meth} {os.environ.get('OPENBLAS_CORETYPE','Haswell')} th={os.environ.get('OPENBLAS_NUM_THREADS','2')} K={K} N={N}: " + "; ".join(res), flush=True)
