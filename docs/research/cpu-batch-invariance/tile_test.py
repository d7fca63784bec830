"""Option (a): fixed row tiles. Every product is a (T, K) @ (K, N) sgemm (rows padded with zeros to a
multiple of T, numpy's stacked matmul loops one sgemm per tile). Checks, for each T: every row of
tiled(X[:M]) for M in 1..MMAX equals the row alone (padded tile, position 0) and the row at a random
position among random neighbours (5 random permutations of all MMAX rows).
usage: python tile_test.py K N MMAX T1 T2 ...   (threads from OPENBLAS_NUM_THREADS)"""
import os, sys, time
import numpy as np
K, N, MMAX = map(int, sys.argv[1:4]); Ts = [int(t) for t in sys.argv[4:]]
rng = np.random.default_rng(1)
W = np.asfortranarray(rng.standard_normal((N, K), dtype=np.float32) * 0.05)
X = rng.standard_normal((MMAX, K), dtype=np.float32)

def tiled(x, w, T):
    n = x.shape[0]; b = -(-n // T)
    xp = np.zeros((b * T, x.shape[1]), np.float32); xp[:n] = x
    return (xp.reshape(b, T, -1) @ w.T).reshape(b * T, -1)[:n]

for T in Ts:
    t = time.time()
    ref = tiled(X, W, T)
    one = np.concatenate([tiled(X[i:i + 1], W, T) for i in range(MMAX)])
    ok_alone = np.array_equal(ref, one)
    bad_m = [M for M in range(1, MMAX + 1) if not np.array_equal(tiled(X[:M], W, T), ref[:M])]
    bad_perm = 0
    for s in range(5):
        p = rng.permutation(MMAX)
        bad_perm += int(not np.array_equal(tiled(X[p], W, T), ref[p]))
    # the stacked matmul must equal one plain (T, K) sgemm per tile
    plain = np.array_equal(ref[:T], X[:T] @ W.T) if MMAX >= T else None
    print(f"K={K} N={N} T={T} threads={os.environ.get('OPENBLAS_NUM_THREADS')}: alone==in-batch {ok_alone}, "
          f"M in 1..{MMAX} differing {len(bad_m)} {bad_m[:8]}, permutations differing {bad_perm}/5, stacked==plain {plain} "
          f"({time.time()-t:.0f}s)")
