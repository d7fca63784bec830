"""Tensor parallel's split on one device (engine/parallel/tensor_parallel.py): the ranks of one process, each
with its own backend and KV cache, their output projections' partials all-reduced, against the whole
model on the same device and file: the prompt's last logits (largest difference against the largest
logit) and the greedy continuation, token for token. On a GPU, with the weights kept in their GGUF
blocks as the engine keeps them, the differences are fp16 rounding's (a sum of partials in place of
one product); on the CPU float32's.

    python tools/checks/tp_check.py --model FILE [--device gpu] [--world 2] [--prompt-tokens 300] [--steps 16]
        [--chunk 128] [--json OUT]

Exit status 0 when the top token after the prompt is the same and the logits agree within --tol."""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from engine.ops.backend import select_backend  # noqa: E402
from engine.model.weights import load_model  # noqa: E402
from engine.kvcache.kv import KVCache  # noqa: E402
from engine.model.forward import LlamaModel  # noqa: E402
from engine.modelfile.model_path import resolve_model_path  # noqa: E402
from engine.parallel.tensor_parallel import TensorParallelModel  # noqa: E402


def run(forward, kv, ids: np.ndarray, steps: int, chunk: int):
    """Prompt logits (read in chunks) and the greedy continuation; seconds taken."""
    started, start, logits = time.perf_counter(), 0, None
    while start < len(ids):
        end = min(start + chunk, len(ids))
        logits = forward(ids[start:end], start, kv, end == len(ids))
        start = end
    first, out, cur = np.asarray(logits, dtype=np.float32), [], logits
    for _ in range(steps):
        out.append(int(np.argmax(cur)))
        cur = forward(np.asarray(out[-1:]), len(ids) + len(out) - 1, kv, True)
    return first, out, time.perf_counter() - started


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "gpu"))
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--prompt-tokens", type=int, default=300)
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--chunk", type=int, default=128)
    p.add_argument("--tol", type=float, default=2e-2, help="largest logit difference / largest |logit| allowed")
    p.add_argument("--json")
    a = p.parse_args()
    backends = [select_backend(a.device) for _ in range(a.world)]
    cfg, weights, _ = load_model(str(resolve_model_path(a.model)), backends[0])
    ids = np.random.default_rng(5).integers(100, min(cfg.vocab_size, 30000), a.prompt_tokens)
    ctx = a.prompt_tokens + a.steps + 1
    whole = LlamaModel(cfg, weights, backends[0])
    ref_logits, ref_tokens, ref_s = run(whole.forward, KVCache(cfg, ctx, backends[0]), ids, a.steps, a.chunk)
    split = TensorParallelModel(cfg, weights, backends)
    tp_logits, tp_tokens, tp_s = run(split.forward, split.make_caches(ctx), ids, a.steps, a.chunk)
    diff = float(np.abs(tp_logits - ref_logits).max() / np.abs(ref_logits).max())
    same = next((i for i, (x, y) in enumerate(zip(tp_tokens, ref_tokens)) if x != y), len(ref_tokens))
    report = {"model": cfg.name, "device": backends[0].device_name, "world": a.world,
              "shard": {"heads": split.cfg.n_heads, "kv_heads": split.cfg.n_kv_heads, "ffn": split.cfg.ffn_dim},
              "prompt_tokens": a.prompt_tokens, "logit_diff_over_max": diff,
              "top1_equal": int(np.argmax(tp_logits)) == int(np.argmax(ref_logits)),
              "greedy_equal_tokens": same, "steps": a.steps, "whole_s": round(ref_s, 2), "split_s": round(tp_s, 2)}
    print(json.dumps(report, indent=1))
    if a.json:
        Path(a.json).write_text(json.dumps(report, indent=1) + "\n")
    return 0 if report["top1_equal"] and diff <= a.tol else 1


if __name__ == "__main__":
    sys.exit(main())
