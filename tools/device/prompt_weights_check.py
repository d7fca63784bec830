"""Prompt weights kept expanded (engine/kvcache/prompt_weights.py), on the GPU: in the engine's own runner, a prompt
read with each quantized matrix expanded at every step, then with every one kept from a single expansion, gives the
same last logits and K rows bit for bit (reads of 2,048 and 64 rows, alone and sharing a step), and the time of a
prompt step each way (medians of CUDA-synchronized steps of 2,048, 512 and 64 rows at depth 0).

    python tools/device/prompt_weights_check.py MODEL.gguf [MODEL.gguf ...] [--json FILE]

Exit status 0 when every check passes.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from functools import partial
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from engine.ops.blas_order import prefer_row_invariant_blas  # noqa: E402
from tools.device.model_checks import report  # noqa: E402

prefer_row_invariant_blas()  # as the engine process does, before CuPy makes its cuBLAS handle

STEPS = (2048, 512, 64)  # rows of the timed prompt steps


def check_model(path: str) -> dict:
    from engine.model.weights import expansion_bytes, keep_expansions, load_model
    from engine.ops.backend import gpu_backend
    from engine.runner.runner import ModelRunner

    backend = gpu_backend()
    cfg, weights, _ = load_model(path, backend, keep_blocks=True)
    runner = ModelRunner(cfg, weights, backend, 2048, 256, frozenset(), max_running=8, blocks=160, block_size=64)
    runner.warm_up()
    model, kv, pool, host = runner.model, runner.kv, runner.pool, backend.to_host
    rng = np.random.default_rng(3)
    a, b = rng.integers(0, cfg.vocab_size, 2048), rng.integers(0, cfg.vocab_size, 64)
    ta, tb = pool.allocate(pool.blocks_for(2049)), pool.allocate(pool.blocks_for(65))

    def reads() -> list[np.ndarray]:
        """A's 2,048 rows alone, then B's 64 beside A's first 64 again: the logits and every layer's K rows."""
        keys = kv.keys.q if hasattr(kv.keys, "q") else kv.keys
        whole = host(model.forward_reads([(a, 0, ta, True)], kv))[0].copy()
        together = host(model.forward_reads([(b, 0, tb, True), (a[:64], 0, ta, True)], kv)).copy()
        return [whole, together, host(keys[:, backend.xp.asarray(np.asarray(ta, dtype=np.int64))]).copy()]

    def step_ms(rows: int) -> float:
        times = []
        for _ in range(7):
            backend.synchronize()
            began = time.perf_counter()
            model.forward_reads([(a[:rows], 0, ta, True)], kv)
            backend.synchronize()
            times.append((time.perf_counter() - began) * 1000)
        return round(statistics.median(times[2:]), 2)

    per_step, per_step_ms = reads(), {rows: step_ms(rows) for rows in STEPS}
    matrices = keep_expansions(backend, weights.layers)
    kept, kept_ms = reads(), {rows: step_ms(rows) for rows in STEPS}
    equal = [bool(np.array_equal(x, y)) for x, y in zip(per_step, kept)]
    return {"model": Path(path).name, "matrices": len(matrices),
            "kept_gib": round(expansion_bytes(matrices) / 2**30, 2),
            "equal_logits_alone_together_k_rows": equal, "ok": all(equal),
            "step_ms_per_step_expansion": per_step_ms, "step_ms_kept": kept_ms}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("models", nargs="+")
    p.add_argument("--json")
    a = p.parse_args()
    return report((({"model": Path(path).name}, partial(check_model, path)) for path in a.models),
                  "PROMPT WEIGHTS CHECK", a.json)


if __name__ == "__main__":
    sys.exit(main())
