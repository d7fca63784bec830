"""Rows that do not depend on the step, on the GPU (issue 44): for each model given, in the engine's
own runner (CUDA graphs on, the KV cache f16 and q8_0), the start-up check passes (runner.shape_free),
a prompt read cut anywhere gives the same last logits and K/V rows as read whole, reads sharing
steps give each its logits alone, and a decode row after them is the same alone and in a batch.
The GPU twin of tests/engine/model/test_forward_reads.py.

    python tools/device/shared_steps_check.py MODEL.gguf [MODEL.gguf ...] [--json FILE]

Exit status 0 when every check passes.
"""
from __future__ import annotations

import argparse
import sys
from functools import partial
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from engine.ops.blas_order import prefer_row_invariant_blas  # noqa: E402
from tools.device.model_checks import report  # noqa: E402

prefer_row_invariant_blas()  # as the engine process does, before CuPy makes its cuBLAS handle

CUTS = ([1], [64, 128, 192, 256, 320], [5, 6, 500], [699], [256, 512])


def runner_for(path: str, kv_type: str):
    from engine.model.weights import load_model
    from engine.ops.backend import gpu_backend
    from engine.runner.runner import ModelRunner

    backend = gpu_backend()
    cfg, weights, _ = load_model(path, backend, keep_blocks=True)
    runner = ModelRunner(cfg, weights, backend, 2048, 256, frozenset(), max_running=8, blocks=160, block_size=64,
                         kv_type=kv_type)
    runner.warm_up()
    return runner


def check_model(path: str, kv_type: str) -> dict:
    runner = runner_for(path, kv_type)
    model, kv, pool, host = runner.model, runner.kv, runner.pool, runner.backend.to_host
    vocab = runner.cfg.vocab_size
    rng = np.random.default_rng(1)
    out = {"model": Path(path).name, "kv_type": kv_type, "shape_free": runner.shape_free}

    def read(ids, table, cuts):
        start, logits = 0, None
        for end in [*cuts, len(ids)]:
            logits = model.forward_reads([(ids[start:end], start, table, end == len(ids))], kv)
            start = end
        return host(logits)[0]

    def rows(table):  # every layer's K rows of the sequence's blocks (a q8_0 pool's quants)
        keys = kv.keys.q if hasattr(kv.keys, "q") else kv.keys
        return host(keys[:, runner.backend.xp.asarray(np.asarray(table, dtype=np.int64))]).copy()

    a = rng.integers(0, vocab, 700)
    ta = pool.allocate(pool.blocks_for(701))
    whole = read(a, ta, [])
    whole_rows = rows(ta)
    cuts_equal = []
    for cuts in CUTS:
        got = read(a, ta, cuts)
        cuts_equal.append(bool(np.array_equal(got, whole) and np.array_equal(rows(ta), whole_rows)))
    out["cut_anywhere_equal"] = cuts_equal

    b, c = rng.integers(0, vocab, 77), rng.integers(0, vocab, 9)
    tb, tc = pool.allocate(pool.blocks_for(78)), pool.allocate(pool.blocks_for(10))
    alone_b, alone_c = read(b, tb, []), read(c, tc, [])
    model.forward_reads([(a[:200], 0, ta, False), (b[:5], 0, tb, False)], kv)
    first = host(model.forward_reads([(c, 0, tc, True), (b[5:60], 5, tb, False), (a[200:201], 200, ta, False)], kv))
    last = host(model.forward_reads([(b[60:], 60, tb, True), (a[201:], 201, ta, True)], kv))
    out["shared_equal"] = [bool(np.array_equal(first[0], alone_c)), bool(np.array_equal(last[0], alone_b)),
                           bool(np.array_equal(last[1], whole))]
    alone = host(runner.decode_logits([7], [ta], [700]))[0].copy()
    batch = host(runner.decode_logits([11, 7, 3], [tb, ta, tc], [77, 700, 9]))
    out["decode_batch_equal"] = bool(np.array_equal(batch[1], alone))
    out["ok"] = bool(out["shape_free"] and all(cuts_equal) and all(out["shared_equal"]) and out["decode_batch_equal"])
    for table in (ta, tb, tc):
        pool.release(table)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("models", nargs="+")
    p.add_argument("--kv-types", default="auto,q8_0")
    p.add_argument("--json")
    a = p.parse_args()
    return report((({"model": Path(path).name, "kv_type": kv_type}, partial(check_model, path, kv_type))
                   for path in a.models for kv_type in a.kv_types.split(",")), "SHARED STEPS CHECK", a.json)


if __name__ == "__main__":
    sys.exit(main())
