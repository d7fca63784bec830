"""Row-local numpy ops the CPU forward uses: is a row's result independent of how many rows come with it?
add_rms_norm's mean over the last axis, exp (softmax, silu), and p.sum over the last axis (attention norm)
for rows of equal length; and the sum over a row padded with trailing zeros (a key tile cut elsewhere)."""
import numpy as np
rng = np.random.default_rng(9)
for dim in (576, 896, 960):
    X = rng.standard_normal((300, dim), dtype=np.float32)
    ref_m = np.mean(X * X, axis=-1, keepdims=True); ref_e = np.exp(X)
    bad_m = [M for M in range(1, 300) if not np.array_equal(np.mean(X[:M] * X[:M], axis=-1, keepdims=True), ref_m[:M])]
    bad_e = [M for M in range(1, 300) if not np.array_equal(np.exp(X[:M]), ref_e[:M])]
    one_e = all(np.array_equal(np.exp(X[i, j:j + 1]), ref_e[i, j:j + 1]) for i in range(3) for j in range(dim))
    print(f"dim={dim}: mean over last axis differs for M in {bad_m[:5]} ({len(bad_m)}); exp differs for M in {bad_e[:5]}; exp of single elements equal: {one_e}")
p = np.exp(rng.standard_normal(2048).astype(np.float32))
diff = sum(not np.array_equal(p[:n].sum(), np.concatenate([p[:n], np.zeros(2048 - n, np.float32)])[:m].sum())
           for n in range(1, 700, 7) for m in (n + 1, n + 64, 1024, 2048) if m <= 2048)
print(f"sum of a row vs the same row with trailing zeros (pairwise summation): {diff} of {sum(1 for n in range(1,700,7) for m in (n+1,n+64,1024,2048) if m<=2048)} differ")
