"""Decode graphs through a batch that grows to its largest size and shrinks again in random steps, on
the engine's own runner (its memory plan: the KV pool takes the device, as when serving), every step a
capture or a replay. Each step's rows are checked against the same row decoded alone (bit for bit:
rows are batch-invariant, padding rows included), and any CUDA fault ends the run with an error. Run
it under `compute-sanitizer --tool memcheck` to catch a bad access where it happens.

    python tools/device/decode_graph_sequence_check.py MODEL.gguf --rows 1,63,64,65,128,256 [--steps 40] [--json FILE]

Issue 42's crash came this way: 64 clients made the engine capture a graph for every batch size the
load passed through, each keeping its own logits, until a capture found the device full and CuPy freed
the blocks the earlier graphs still used (engine/runner/graph_pool.py).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from engine.cli import build_parser, config_from_args  # noqa: E402
from engine.startup import build_runner  # noqa: E402


class Rows:
    """The sequences of one run: each with a block table, a position and its next token."""

    def __init__(self, runner, count: int, rng: np.random.Generator, steps: int, reads: int = 0):
        """reads: 0, every sequence's prompt read; else only the first `reads` are, and sequence i past them
        takes a copy of sequence i % reads's blocks (its own next token still: under a sanitizer, whose
        cost is per launch, 128 prompts' reads alone take minutes)."""
        self.runner, self.tables, self.positions, self.tokens = runner, [], [], []
        vocab, copies = runner.vocab_size, []
        for i in range(count):
            copied = bool(reads) and i >= reads
            # most prompts short; every eighth crosses into the 2,048-key graphs' bucket
            length = (self.positions[i % reads] if copied else
                      int(rng.integers(1030, 1100)) if i % 8 == 7 else int(rng.integers(8, 120)))
            table = runner.pool.allocate(runner.pool.blocks_for(length + steps + 1))
            if copied:
                runner.kv.restore(table, copies[i % reads])
            else:
                runner.forward(rng.integers(0, vocab, size=length, dtype=np.int64), 0, table, want_logits=False)
                if reads:
                    copies.append(runner.kv.snapshot(table, length))
            self.tables.append(table)
            self.positions.append(length)
            self.tokens.append(int(rng.integers(0, vocab)))
        runner.synchronize()

    def release(self) -> None:
        for table in self.tables:
            self.runner.pool.release(table)


def walk(count: int, steps: int, rng: np.random.Generator) -> list[int]:
    """Batch sizes: up from 1 to `count` in random strides, then down to 1 again, `steps` in all."""
    up = steps // 2
    sizes = []
    for i in range(steps):
        target = count if i < up else 1
        left = (up - i) if i < up else (steps - i)
        here = sizes[-1] if sizes else 1
        stride = max(1, abs(target - here) // max(1, left))
        here += int(np.sign(target - here)) * int(rng.integers(1, 2 * stride + 1))
        sizes.append(int(min(count, max(1, here))))
    sizes[up - 1] = count  # the largest size is always reached
    return sizes


def run_size(runner, count: int, steps: int, seed: int, solo_checks: int, reads: int = 0) -> dict:
    cp, rng = runner.backend.xp, np.random.default_rng(seed)
    rows = Rows(runner, count, rng, steps, reads)
    mismatches, sizes, began = [], walk(count, steps, rng), time.perf_counter()
    try:
        for step, n in enumerate(sizes):
            active = sorted(rng.choice(count, size=n, replace=False).tolist())
            for b in range(0, n, runner.max_batch):  # as the loop does: MAX_BATCH rows a forward
                batch = active[b : b + runner.max_batch]
                logits = runner.decode_logits([rows.tokens[i] for i in batch], [rows.tables[i] for i in batch],
                                              [rows.positions[i] for i in batch])
                got = cp.asnumpy(logits)  # (rows, vocab): before another replay reuses the buffer
                for j in rng.choice(len(batch), size=min(solo_checks, len(batch)), replace=False):
                    i = batch[j]
                    alone = cp.asnumpy(runner.decode_logits([rows.tokens[i]], [rows.tables[i]], [rows.positions[i]]))[0]
                    if not np.array_equal(alone, got[j]):
                        mismatches.append({"step": step, "rows": len(batch), "row": int(j),
                                           "max_abs": float(np.abs(alone - got[j]).max())})
                for j, i in enumerate(batch):
                    rows.tokens[i] = int(np.argmax(got[j]))
                    rows.positions[i] += 1
        runner.synchronize()
    finally:
        rows.release()
    decoder = runner.decoder
    return {"sequences": count, "steps": steps, "largest_step": max(sizes), "mismatches": mismatches,
            "graphs": sorted(decoder.captured) if decoder else None, "seconds": round(time.perf_counter() - began, 2)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model")
    p.add_argument("--rows", default="1,63,64,65,128,256", help="the largest batch of each run, comma-separated")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--solo", type=int, default=2, help="rows of each step checked against their solo decode")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--reads", type=int, default=0, help="prompts read (the other sequences copy their blocks; 0: all)")
    p.add_argument("--json")
    a, engine_args = p.parse_known_args()
    runner, _, _ = build_runner(config_from_args(build_parser().parse_args(["--model", a.model, *engine_args])))
    if runner.decoder is None:
        print("no decode graphs on this device (the GPU engine captures them)", file=sys.stderr)
        return 2
    results = []
    for count in (int(r) for r in a.rows.split(",")):
        results.append(run_size(runner, count, a.steps, a.seed + count, a.solo, a.reads))
        r = results[-1]
        print(f"{count} sequences: {r['steps']} steps in {r['seconds']} s, {len(r['graphs'])} graphs, "
              f"{len(r['mismatches'])} rows unlike their solo run", flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1))
    return 1 if any(r["mismatches"] for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
