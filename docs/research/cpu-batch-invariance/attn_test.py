"""Attention on the CPU: does a query row's output depend on the chunk it is computed in?
today = engine ArrayOps.attention (key tiles of 2048 cut at the chunk's end, p.sum over the cut length, BLAS
rows = group*n). fixed = key tiles of TILE at absolute boundaries, the last one padded to TILE with masked keys
(-inf score, zero value), so every product and sum has the same shape whatever the chunk; query rows in any
count. Row p is computed in chunks [0, L), [s, L), [p, p+1) (a decode row) and compared bitwise."""
import os, sys
sys.path.insert(0, "/work/main")
import numpy as np
from engine.ops.backend import ArrayOps
from engine.core.step import Step

TILE = 256
kvh, group, d, L, B = 3, 3, 64, 700, 64  # SmolLM2: 9 heads, 3 kv heads, head dim 64
rng = np.random.default_rng(5)
nb = -(-L // B)
kc = rng.standard_normal((nb, kvh, B, d), dtype=np.float32); vc = rng.standard_normal((nb, kvh, B, d), dtype=np.float32)
table = np.arange(nb, dtype=np.int32)
Q = rng.standard_normal((L, kvh * group, d), dtype=np.float32)
ops = ArrayOps(np)

def fixed(q, start):
    n = q.shape[0]; end = start + n
    keys = ops.sequence_rows(kc, table, end); vals = ops.sequence_rows(vc, table, end)
    nt = -(-end // TILE)
    kp = np.zeros((kvh, nt * TILE, d), np.float32); kp[:, :end] = keys
    vp = np.zeros((kvh, nt * TILE, d), np.float32); vp[:, :end] = vals
    qg = (q.reshape(n, kvh, group, d).transpose(1, 2, 0, 3) * np.float32(1 / np.sqrt(d))).reshape(kvh, group * n, d)
    pos = np.tile(np.arange(start, end), group)  # each query row's position, rows ordered (g, i)
    best = acc = norm = None
    for t in range(nt):
        s = qg @ kp[:, t * TILE:(t + 1) * TILE].transpose(0, 2, 1)  # (kvh, group*n, TILE): fixed K = d
        s[:, np.arange(t * TILE, (t + 1) * TILE)[None, :] > pos[:, None]] = -np.inf  # causal (and padding) mask
        m = s.max(-1, keepdims=True)
        nbst = m if best is None else np.maximum(best, m)
        p = np.exp(s - nbst)
        pv = p @ vp[:, t * TILE:(t + 1) * TILE]  # fixed inner length TILE
        ps = p.sum(-1, keepdims=True)  # fixed length TILE, a row's own contiguous sum
        if best is None: acc, norm = pv, ps
        else:
            c = np.exp(best - nbst); acc = acc * c + pv; norm = norm * c + ps
        best = nbst
    return (acc / norm).reshape(kvh, group, n, d).transpose(2, 0, 1, 3).reshape(n, -1)

for name, f in (("today", lambda q, s: ops.attention(q, kc, vc, Step(q.shape[0], s, (table,)))), ("fixed", fixed)):
    whole = f(Q, 0)
    bad = {}
    for s, e in ((100, L), (256, 512), (400, 640), (600, 650), (512, 576)):
        part = f(Q[s:e], s)
        bad[f"chunk[{s},{e})"] = int(np.sum(np.any(part != whole[s:e], axis=1)))
    dec = np.concatenate([f(Q[p:p + 1], p) for p in range(600, L)])
    bad[f"decode rows 600..{L-1}"] = int(np.sum(np.any(dec != whole[600:], axis=1)))
    print(f"{name} coretype={os.environ.get('OPENBLAS_CORETYPE', 'default')} threads={os.environ.get('OPENBLAS_NUM_THREADS')}: "
          f"rows differing from the same row in chunk [0,{L}): {bad}")
