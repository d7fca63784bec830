"""Decode graphs with programmatic dependent launch (engine/kernels/launch.py) against graphs
without it, on one model in one process: every step's logits must be the same bits (the same
kernels in the same order; only when each may start changes) and the greedy tokens those of eager
steps; then the replay time of each, alternating, medians.

    python tools/device/pdl_check.py --model PATH [--context 512] [--steps 32] [--json OUT --label NAME]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from engine.ops.backend import select_backend  # noqa: E402
from engine.runner.decode_graph import GraphDecoder  # noqa: E402
from engine.model.weights import load_model  # noqa: E402
from engine.kvcache.kv import KVCache  # noqa: E402
from engine.model.forward import LlamaModel  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--model", required=True)
    p.add_argument("--context", type=int, default=512)
    p.add_argument("--steps", type=int, default=32)
    p.add_argument("--repeats", type=int, default=200, help="replays timed per form")
    p.add_argument("--json")
    p.add_argument("--label")
    a = p.parse_args()
    backend = select_backend("gpu")
    cp, kernels = backend.xp, backend.kernels
    cfg, weights, _ = load_model(a.model, backend)
    model = LlamaModel(cfg, weights, backend)
    kv = KVCache(cfg, a.context + a.steps + 8, backend)
    tokens = np.random.default_rng(0).integers(100, cfg.vocab_size - 100, a.context + a.steps + 1)
    model.forward(tokens[: a.context], 0, kv, want_logits=True)
    if not kernels.pdl:
        print("this device has no programmatic dependent launch (or STRATA_PDL=0): nothing to compare")
        return 1

    def run(pdl: bool):
        kernels.pdl = pdl
        graphs = GraphDecoder(model, kv, backend)
        graphs.decode_one(int(tokens[a.context]), a.context)  # the capture (an eager run)
        out = []
        for i in range(a.steps):
            pos = a.context + i
            logits = graphs.decode_one(int(tokens[pos]), pos)
            out.append((cp.asnumpy(logits), graphs.greedy_token()))
        return graphs, out

    plain, base = run(False)
    dependent, got = run(True)
    same = all(np.array_equal(x[0], y[0]) for x, y in zip(base, got))
    greedy = [t for _, t in got]
    eager = []
    for i in range(a.steps):
        eager.append(int(np.argmax(model.forward(tokens[a.context + i: a.context + i + 1], a.context + i, kv,
                                                 want_logits=True))))  # (vocab,) on the host
    times = {"plain": [], "pdl": []}
    pos = a.context + a.steps - 1
    for i in range(a.repeats):
        for name, graphs in (("plain", plain), ("pdl", dependent)):
            entry = graphs.entry(1, pos)
            start, end = cp.cuda.Event(), cp.cuda.Event()
            start.record(graphs.stream)
            graphs.replay(entry, [int(tokens[pos])], [kv.lone_table(pos + 1)], [pos])
            end.record(graphs.stream)
            end.synchronize()
            times[name].append(cp.cuda.get_elapsed_time(start, end))
    ms = {k: round(statistics.median(v), 4) for k, v in times.items()}
    result = {"model": Path(a.model).name, "context": a.context, "steps": a.steps, "logits_identical": same,
              "greedy_equals_eager": greedy == eager, "replay_ms": ms,
              "tok_s": {k: round(1e3 / v, 1) for k, v in ms.items()}, "gain": round(ms["plain"] / ms["pdl"], 3)}
    print(json.dumps(result))
    if a.json:
        path = Path(a.json)
        merged = json.loads(path.read_text()) if path.exists() else {}
        path.write_text(json.dumps(merged | {a.label or result["model"]: result}, indent=1) + "\n")
    return 0 if same and greedy == eager else 1


if __name__ == "__main__":
    sys.exit(main())
