"""The hybrid families (qwen3next, qwen35, qwen35moe) on the GPU: each tiny fixture of tests/fixtures/hybrid against
the logits and greedy tokens transformers computed from it (hybrid_golden.json), and the GPU path's exactness:
a prompt's logits and state the same bits however its read is cut (a cut short of a chunk boundary read again
from its mark), beside another read, and a decode row's beside another's. (A prompt row and a decode row take
different matrix kernels, so they are compared to transformers, not to each other.)

    python tools/device/hybrid_check.py [--json OUT] [--device cpu]   (cpu: the script's own check, on NumPy)

Exit status 0 when every family passes. The GPU's activations are fp16, so the logits are compared to
transformers' float32 ones within a tolerance scaled to the logits' spread, and the first greedy token must match
(continuations may part where transformers' margins are within fp16's rounding, as llama.cpp's do: reported).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from engine.ops.blas_order import prefer_row_invariant_blas  # noqa: E402

prefer_row_invariant_blas()  # as the engine process does, before NumPy and CuPy load

import numpy as np  # noqa: E402

from engine.kernels.model_parts import ModelKernels  # noqa: E402
from engine.kvcache.recurrent import SequenceState  # noqa: E402
from engine.model.weights import load_model  # noqa: E402
from engine.modelfile.gguf_file import GGUFFile  # noqa: E402
from engine.modelfile.model_config import read_config  # noqa: E402
from engine.ops.backend import cpu_backend, gpu_backend  # noqa: E402
from engine.runner.runner import ModelRunner  # noqa: E402

FIXTURES = ROOT / "tests/fixtures/hybrid"
CHUNK = 64
TOLERANCE = 0.02  # of the logits' spread (max - min): fp16 activations against float32


def open_runner(path: Path, device: str) -> ModelRunner:
    reader = GGUFFile(str(path), "r")
    backend = gpu_backend(ModelKernels.of(read_config(reader), reader)) if device == "gpu" else cpu_backend()
    cfg, weights, _ = load_model(str(path), backend, reader=reader)
    backend.ready()
    runner = ModelRunner(cfg, weights, backend, ctx=1024, chunk=CHUNK, eos_ids=frozenset(), max_running=4)
    runner.warm_up()
    return runner


def read(runner: ModelRunner, ids, table, cuts=(), state: SequenceState | None = None):
    """ids read from position 0 in pieces ending at `cuts` (then at its end), each from the state's mark as the
    engine reads -> (the last logits on the host, the state)."""
    state = state or SequenceState.fresh(runner.recurrent)
    logits = None
    for end in [*cuts, len(ids)]:
        pos = state.rewind()
        logits = runner.forward(np.asarray(ids[pos:end]), pos, table, want_logits=end == len(ids), state=state)
        state.read(pos, end - pos)
    return runner.backend.to_host(logits), state


def decode(runner: ModelRunner, tokens, tables, states):
    """One decode step: row i is tokens[i] at states[i]'s next position -> logits (rows, vocab) on the host."""
    logits = runner.decode_logits(list(tokens), tables, [s.now_at for s in states], list(states))
    for s in states:
        s.decoded()
    return runner.backend.to_host(logits)


def same_state(a: SequenceState, b: SequenceState) -> bool:
    return a.now.digest() == b.now.digest() and a.mark.digest() == b.mark.digest()


def against_transformers(runner: ModelRunner, spec: dict) -> dict:
    worst, first_ok, same = 0.0, True, []
    for case in spec["cases"]:
        ids = case["ids"]
        table = runner.pool.allocate(runner.pool.blocks_for(len(ids) + len(case["greedy"]) + 1))
        logits, state = read(runner, ids, table)
        top = [i for i, _ in case["top"]]
        want = np.array([v for _, v in case["top"]] + list(case["probe_logits"]))
        got = np.concatenate([logits[top], logits[case["probes"]]])
        worst = max(worst, float(np.abs(got - want).max() / (want.max() - want.min())))
        tokens = [int(np.argmax(logits))]
        while len(tokens) < len(case["greedy"]):
            tokens.append(int(np.argmax(decode(runner, [tokens[-1]], [table], [state])[0])))
        first_ok &= tokens[0] == case["greedy"][0]
        same.append(next((i for i, (a, b) in enumerate(zip(tokens, case["greedy"])) if a != b), len(tokens)))
        runner.pool.release(table)
    return {"worst_error_of_spread": worst, "first_greedy_token_matches": first_ok,
            "greedy_tokens_equal_before_parting": same, "ok": first_ok and worst <= TOLERANCE}


def exactness(runner: ModelRunner) -> dict:
    rng = np.random.default_rng(1)
    ids = rng.integers(0, runner.vocab_size, 150)
    table = runner.pool.allocate(runner.pool.blocks_for(160))
    whole, whole_state = read(runner, ids, table)
    out = {}
    for cuts in ([64], [64, 128], [100]):  # a cut at 100 is read again from 64, its mark
        got, state = read(runner, ids, table, cuts)
        out[f"cut at {cuts}"] = bool(np.array_equal(got, whole)) and same_state(state, whole_state)
    other = runner.pool.allocate(runner.pool.blocks_for(160))
    b = rng.integers(0, runner.vocab_size, 40)
    alone_b, b_state = read(runner, b, other)
    sa, sb = SequenceState.fresh(runner.recurrent), SequenceState.fresh(runner.recurrent)
    if runner.shape_free:
        both = runner.model.forward_reads([(ids, 0, table, True), (b, 0, other, True)], runner.kv, states=(sa, sb))
        both = runner.backend.to_host(both)
        out["two reads sharing a step"] = bool(np.array_equal(both[0], whole) and np.array_equal(both[1], alone_b))
    next_tokens = [int(ids[0]), int(b[0])]
    solo = [decode(runner, [next_tokens[1]], [other], [b_state])[0]]
    _, sa = read(runner, ids, table)
    _, sb = read(runner, b, other)
    pair = decode(runner, next_tokens, [table, other], [sa, sb])
    out["a decode row beside another"] = bool(np.array_equal(pair[1], solo[0]))
    runner.pool.release(table)
    runner.pool.release(other)
    return {"checks": out, "ok": all(out.values())}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", help="write the report here too")
    p.add_argument("--device", choices=("gpu", "cpu"), default="gpu")
    args = p.parse_args()
    golden = json.loads((FIXTURES / "hybrid_golden.json").read_text())
    report = {}
    for name, spec in sorted(golden["models"].items()):
        runner = open_runner(FIXTURES / spec["file"], args.device)
        report[name] = {"reference": against_transformers(runner, spec), "exactness": exactness(runner),
                        "shape_free": runner.shape_free}
        print(name, json.dumps(report[name]), flush=True)
    ok = all(r["reference"]["ok"] and r["exactness"]["ok"] for r in report.values())
    print("hybrid check:", "PASS" if ok else "FAIL")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
