"""Batch invariance of numpy's x @ w.T (OpenBLAS) for w (N, K) float32 column-major like rows_matrix.
usage: python inv_test.py K N MMAX [step]  (env decides threads / coretype)
For every M in the set: row i of X[:M] @ W.T vs (a) row i alone (1-row matmul) and (b) row i inside M=512,
and (c) position: the same M rows rolled by M//2 -> each row equal to itself in the unrolled block."""
import os, sys, time
import numpy as np
K, N, MMAX = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
ms = list(range(1, MMAX + 1)) if len(sys.argv) < 5 else sorted(set(list(range(1, 70)) + list(range(70, MMAX + 1, int(sys.argv[4]))) + [MMAX]))
rng = np.random.default_rng(0)
W = np.asfortranarray(rng.standard_normal((N, K), dtype=np.float32) * 0.05)
X = rng.standard_normal((MMAX, K), dtype=np.float32)
alone = np.concatenate([X[i:i + 1] @ W.T for i in range(MMAX)])
full = X @ W.T
bad_alone, bad_full, bad_pos = [], [], []
t = time.time()
for M in ms:
    Y = X[:M] @ W.T
    if not np.array_equal(Y, alone[:M]): bad_alone.append(M)
    if not np.array_equal(Y, full[:M]): bad_full.append(M)
    s = M // 2
    if M > 1:
        Yr = np.roll(X[:M], s, axis=0) @ W.T
        if not np.array_equal(np.roll(Yr, -s, axis=0), Y): bad_pos.append(M)
def rng_str(l):
    if not l: return "none"
    out, a = [], l[0]
    for p, q in zip(l, l[1:] + [None]):
        if q != p + 1 and (q is None or q not in ms or q != p + 1):
            out.append(f"{a}" if a == p else f"{a}-{p}"); a = q
    return ",".join(out)
env = {k: v for k, v in os.environ.items() if k.startswith(("OPENBLAS", "OMP"))}
print(f"K={K} N={N} M in {ms[0]}..{ms[-1]} ({len(ms)} sizes) env={env} {time.time()-t:.0f}s")
print(f"  M where rows != 1-row alone : {rng_str(bad_alone)}")
print(f"  M where rows != inside M={MMAX}: {rng_str(bad_full)}")
print(f"  M where roll changes a row  : {rng_str(bad_pos)}")
if bad_alone:
    M = bad_alone[-1]; d = np.abs(X[:M] @ W.T - alone[:M]); print(f"  e.g. M={M}: max|diff| {d.max():.3g}, frac elems differ {np.mean(d>0):.3g}")
