"""Routed experts in host memory behind device slots (engine/ops/expert_cache.py, issue 46) on a GPU: BATCH requests'
prompts read and decoded together with every expert resident, then with each layer's experts behind SLOTS device
slots: the same tokens and logits bit for bit, the decode's tokens per second either way (all requests together),
the cache's hits, misses and bytes copied.

    python tools/device/expert_cache_check.py MODEL.gguf [--slots 32 64] [--batch 1 4] [--prompt 512] [--steps 32]
        [--device cpu] [--json OUT]

Exit status 0 when every cached run equals the resident one.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from engine.ops.blas_order import prefer_row_invariant_blas  # noqa: E402

prefer_row_invariant_blas()

import numpy as np  # noqa: E402

from engine.kernels.model_parts import ModelKernels  # noqa: E402
from engine.model.weights import load_model  # noqa: E402
from engine.modelfile.gguf_file import GGUFFile  # noqa: E402
from engine.modelfile.model_config import read_config  # noqa: E402
from engine.ops.backend import cpu_backend, gpu_backend  # noqa: E402
from engine.ops.expert_cache import ExpertCache  # noqa: E402
from engine.runner.runner import ModelRunner  # noqa: E402


def run(path: str, slots: int | None, prompts: list[np.ndarray], steps: int, device: str = "gpu") -> dict:
    reader = GGUFFile(path, "r")
    backend = gpu_backend(ModelKernels.of(read_config(reader), reader)) if device == "gpu" else cpu_backend()
    cfg, weights, _ = load_model(path, backend, reader=reader, expert_slots=slots)
    backend.ready()
    blocks = sum(-(-(len(p) + steps + 1) // 64) for p in prompts)
    runner = ModelRunner(cfg, weights, backend, ctx=4096, chunk=2048, eos_ids=frozenset(), max_running=len(prompts),
                         blocks=blocks + 1, block_size=64)
    tables = [runner.pool.allocate(runner.pool.blocks_for(len(p) + steps + 1)) for p in prompts]
    rows = []
    for prompt, table in zip(prompts, tables):
        pos, logits = 0, None
        while pos < len(prompt):
            end = min(len(prompt), pos + 2048)
            logits = runner.forward(prompt[pos:end], pos, table, end == len(prompt))
            pos = end
        rows.append(backend.to_host(logits)[None])
    rows = [np.concatenate(rows)]  # (requests, vocab) a step
    backend.synchronize()
    began = time.perf_counter()
    for i in range(steps):
        tokens = [int(t) for t in np.argmax(rows[-1], axis=-1)]
        logits = runner.decode_logits(tokens, tables, [len(p) + i for p in prompts])
        rows.append(backend.to_host(logits[: len(prompts)]))
    backend.synchronize()
    seconds = time.perf_counter() - began
    caches = [layer.experts for layer in weights.layers if isinstance(layer.experts, ExpertCache)]
    counts = {k: sum(getattr(c.counts, k) for c in caches) for k in ("hits", "misses", "bytes_copied")}
    return {"slots": slots, "requests": len(prompts), "decode_tok_s": steps * len(prompts) / seconds, "rows": rows,
            **counts}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model")
    p.add_argument("--slots", type=int, nargs="+", default=[32, 64])
    p.add_argument("--batch", type=int, nargs="+", default=[1], help="requests decoded together (each a run)")
    p.add_argument("--prompt", type=int, default=512)
    p.add_argument("--steps", type=int, default=32)
    p.add_argument("--device", choices=("gpu", "cpu"), default="gpu", help="cpu: the script's own check")
    p.add_argument("--json")
    a = p.parse_args()
    rng = np.random.default_rng(0)
    report, ok = [], True
    for batch in a.batch:
        prompts = [rng.integers(100, 30000, a.prompt) for _ in range(batch)]
        resident = run(a.model, None, prompts, a.steps, a.device)
        report.append({k: v for k, v in resident.items() if k != "rows"})
        print(json.dumps(report[-1]), flush=True)
        for slots in a.slots:
            cached = run(a.model, slots, prompts, a.steps, a.device)
            same = all(np.array_equal(x, y) for x, y in zip(resident["rows"], cached["rows"]))
            ok &= same
            report.append({k: v for k, v in cached.items() if k != "rows"} | {"same_bits": same})
            print(json.dumps(report[-1]), flush=True)
    print("expert cache check:", "PASS" if ok else "FAIL")
    if a.json:
        Path(a.json).write_text(json.dumps({"runs": report}, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
