"""Routed experts in host memory behind device slots (engine/ops/expert_cache.py, issue 46) on a GPU: a MoE file read
and decoded with every expert resident, then with each layer's experts behind SLOTS device slots: the same tokens
and logits bit for bit, the decode's tokens per second either way, the cache's hits, misses and bytes copied.

    python tools/device/expert_cache_check.py MODEL.gguf [--slots 32 64] [--prompt 512] [--steps 32] [--json OUT]

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
from engine.ops.backend import gpu_backend  # noqa: E402
from engine.ops.expert_cache import ExpertCache  # noqa: E402
from engine.runner.runner import ModelRunner  # noqa: E402


def run(path: str, slots: int | None, prompt: np.ndarray, steps: int) -> dict:
    reader = GGUFFile(path, "r")
    backend = gpu_backend(ModelKernels.of(read_config(reader), reader))
    cfg, weights, _ = load_model(path, backend, reader=reader, expert_slots=slots)
    backend.ready()
    runner = ModelRunner(cfg, weights, backend, ctx=4096, chunk=2048, eos_ids=frozenset(), max_running=4)
    table = runner.pool.allocate(runner.pool.blocks_for(len(prompt) + steps + 1))
    pos, logits = 0, None
    while pos < len(prompt):
        end = min(len(prompt), pos + 2048)
        logits = runner.forward(prompt[pos:end], pos, table, end == len(prompt))
        pos = end
    rows = [backend.to_host(logits)]
    backend.synchronize()
    began = time.perf_counter()
    for i in range(steps):
        token = int(np.argmax(rows[-1]))
        rows.append(backend.to_host(runner.decode_logits([token], [table], [len(prompt) + i])[0]))
    backend.synchronize()
    caches = [layer.experts for layer in weights.layers if isinstance(layer.experts, ExpertCache)]
    counts = {k: sum(getattr(c.counts, k) for c in caches) for k in ("hits", "misses", "bytes_copied")}
    return {"slots": slots, "decode_tok_s": steps / (time.perf_counter() - began), "rows": rows, **counts}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model")
    p.add_argument("--slots", type=int, nargs="+", default=[32, 64])
    p.add_argument("--prompt", type=int, default=512)
    p.add_argument("--steps", type=int, default=32)
    p.add_argument("--json")
    a = p.parse_args()
    prompt = np.random.default_rng(0).integers(100, 30000, a.prompt)
    resident = run(a.model, None, prompt, a.steps)
    report, ok = [], True
    for slots in a.slots:
        cached = run(a.model, slots, prompt, a.steps)
        same = all(np.array_equal(x, y) for x, y in zip(resident["rows"], cached["rows"]))
        ok &= same
        report.append({k: v for k, v in cached.items() if k != "rows"} | {"same_bits": same})
        print(json.dumps(report[-1]), flush=True)
    print(json.dumps({"resident_decode_tok_s": resident["decode_tok_s"]}))
    print("expert cache check:", "PASS" if ok else "FAIL")
    if a.json:
        Path(a.json).write_text(json.dumps({"resident_decode_tok_s": resident["decode_tok_s"], "cached": report},
                                           indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
