"""Aggregate decode throughput with several requests in the engine's KV pool, and the check that goes
with it: each request's greedy tokens decoded in a batch equal its tokens decoded alone.

    python bench/batch_decode_bench.py [--model PATH] [--device cpu|gpu] [--batches 1,2,4,8,16]
        [--context 512] [--steps 64] [--repeats 3] [--weights quantized|fp16] [--reads 4096,32768]
        [--profile 4096] [--label NAME --json FILE]

Runs the engine's runner in process as the engine loop drives it (engine/loop/rounds.py): every sequence
reads its own prompt into its own KV blocks, then each step samples every sequence's token where its
logits are and runs one batched forward for all of them (a CUDA graph replay per batch size on the
GPU). Reports, per batch size, aggregate tok/s (tokens of all sequences per second, median of
repeats) and whether every sequence's tokens equal its solo run's. With --reads, first a prompt of each
size read alone, in --chunk chunks as the engine reads one request (any family, the hybrids' too: tok/s,
median of repeats). With --profile N, where the time goes by operation (the backend's ops, CUDA events around
each on a GPU): a prompt of N tokens read alone, and one eager decode step of one request after it.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.engine_bench import TimedOps, machine, merge_result  # noqa: E402 (first: the engine's BLAS settings,
# engine/ops/blas_order.py, set before NumPy and CuPy load, as the engine process runs)
import numpy as np  # noqa: E402
from engine.ops.backend import select_backend  # noqa: E402
from engine.model.weights import load_model  # noqa: E402
from engine.modelfile.model_path import resolve_model_path  # noqa: E402
from engine.runner.runner import ModelRunner  # noqa: E402
from engine.runner.sampler import Sampler, SamplingParams  # noqa: E402
from engine.runner.sequence import Sequence  # noqa: E402


def greedy_request(runner: ModelRunner, ident: int, seed: int, size: int, vocab: int, room: int,
                   max_new: int = 1 << 30) -> Sequence:
    """A greedy request of a random `size`-token prompt (from `seed`), its blocks for `room` positions had."""
    prompt = tuple(int(t) for t in np.random.default_rng(seed).integers(100, vocab - 100, size))
    return Sequence(id=ident, prompt=prompt, max_new=max_new, sampler=Sampler(SamplingParams(), prompt),
                    stop_ids=frozenset(), table=runner.pool.allocate(runner.pool.blocks_for(room)))


def read_prompts(runner: ModelRunner, count: int, context: int, vocab: int, room: int) -> list[Sequence]:
    """`count` sequences, each with its own random prompt read into its own blocks (room for `room`
    positions, the whole run, allocated up front)."""
    seqs = []
    for i in range(count):
        seq = greedy_request(runner, i, 1000 + i, context, vocab, room)
        while seq.reading:
            runner.read_prompt_chunk(seq)
        seqs.append(seq)
    return seqs


def read_alone(runner: ModelRunner, size: int, vocab: int) -> float:
    """One request's prompt of `size` tokens read alone, chunk by chunk -> tok/s (its blocks given back)."""
    seq = greedy_request(runner, -1, size, size, vocab, size, max_new=1)
    runner.backend.synchronize()
    began = time.perf_counter()
    while seq.reading:
        runner.read_prompt_chunk(seq)
    runner.backend.synchronize()
    seconds = time.perf_counter() - began
    runner.pool.release(seq.table)
    return size / seconds


def profile(runner: ModelRunner, size: int, vocab: int) -> dict:
    """ms by operation: a `size`-token prompt read alone (as read_alone), then one eager decode step after it."""
    model, out = runner.model, {}
    seq = greedy_request(runner, -2, size + 1, size, vocab, size + 1, max_new=2)
    decoder, runner.decoder = runner.decoder, None  # the decode step eager: each operation timed
    try:
        for phase in ("read", "decode"):
            model.ops = TimedOps(runner.backend.ops, runner.backend.xp)
            if phase == "read":
                while seq.reading:
                    runner.read_prompt_chunk(seq)
            else:
                seq.generated.append(int(np.argmax(runner.backend.to_host(seq.logits))))
                runner.decode_batch([seq])
            out[phase] = model.ops.totals_ms()
    finally:
        model.ops, runner.decoder = runner.backend.ops, decoder
        runner.pool.release(seq.table)
    return {"tokens": size, "ms": out}


def decode(runner: ModelRunner, seqs: list[Sequence], steps: int) -> tuple[float, list[list[int]]]:
    """`steps` tokens for every sequence, all in one batch; (seconds, each one's tokens). The
    sequences start again from the logits of their prompts (later KV rows are overwritten; a hybrid's
    recurrent state is put back where its prompt left it, in place: decode graphs hold its address)."""
    start_logits = [s.logits for s in seqs]
    start_states = [(s.state.now.copy(), s.state.now_at) for s in seqs if s.state is not None]
    for seq in seqs:
        seq.generated = []
    runner.backend.synchronize()
    began = time.perf_counter()
    for _ in range(steps):
        for seq in seqs:
            seq.generated.append(runner.sample(seq))
        runner.decode_batch(seqs)
    runner.backend.synchronize()
    seconds = time.perf_counter() - began
    tokens = [list(s.generated) for s in seqs]
    for seq, logits in zip(seqs, start_logits):
        seq.logits, seq.graph_row = logits, None
    for seq, (state, at) in zip([s for s in seqs if s.state is not None], start_states):
        seq.state.now.conv[...], seq.state.now.ssm[...], seq.state.now_at = state.conv, state.ssm, at
    return seconds, tokens


def run(a: argparse.Namespace) -> dict:
    backend = select_backend(a.device)
    cfg, weights, _ = load_model(str(resolve_model_path(a.model)), backend, keep_blocks=a.weights == "quantized")
    batches = sorted(int(b) for b in a.batches.split(","))
    reads = [int(n) for n in a.reads.split(",")] if a.reads else []
    ctx = (max([a.context + a.steps + 1, a.profile or 0, *reads]) + 1 + 255) // 256 * 256
    runner = ModelRunner(cfg, weights, backend, ctx, a.chunk, frozenset(), max_running=batches[-1],
                         blocks=max(batches[-1] * -(-(a.context + a.steps + 1) // 64), -(-ctx // 64)) + 1,
                         block_size=64)
    runner.warm_up()
    read_rows = {}
    for size in reads:
        read_alone(runner, min(size, a.chunk), cfg.vocab_size)  # (first-call costs outside the timing)
        read_rows[str(size)] = round(statistics.median(read_alone(runner, size, cfg.vocab_size)
                                                       for _ in range(a.repeats)), 1)
        print(f"a {size}-token prompt read alone: {read_rows[str(size)]:.1f} tok/s", flush=True)
    profiled = profile(runner, a.profile, cfg.vocab_size) if a.profile else None
    for phase, ms in (profiled or {}).get("ms", {}).items():
        print(f"profile, {phase}: " + ", ".join(f"{k} {v:.2f}" for k, v in list(ms.items())[:10]) + " (ms)", flush=True)
    seqs = read_prompts(runner, batches[-1], a.context, cfg.vocab_size, a.context + a.steps + 1)
    solo = [decode(runner, [seq], a.steps)[1][0] for seq in seqs]  # each alone (its graphs captured too)
    rows = []
    for n in batches:
        group = seqs[:n]
        decode(runner, group, 2)  # this batch size's graph is captured outside the timing
        runs = [decode(runner, group, a.steps) for _ in range(a.repeats)]
        same = all(tokens == solo[i] for _, out in runs for i, tokens in enumerate(out))
        tok_s = [n * a.steps / seconds for seconds, _ in runs]
        rows.append({"requests": n, "aggregate_tok_s": round(statistics.median(tok_s), 1),
                     "per_request_tok_s": round(statistics.median(tok_s) / n, 1),
                     "step_ms": round(statistics.median(seconds for seconds, _ in runs) / a.steps * 1000, 3),
                     "runs_tok_s": [round(t, 1) for t in tok_s], "tokens_equal_solo": same})
        print(f"{n:3d} requests: {rows[-1]['aggregate_tok_s']:9.1f} tok/s aggregate, "
              f"step {rows[-1]['step_ms']:.2f} ms, tokens equal solo: {same}", flush=True)
    return {"machine": machine(backend.device_name), "device": backend.name, "model": cfg.name, "arch": cfg.arch,
            "weights": a.weights if backend.name == "gpu" else "float32", "context": a.context, "steps": a.steps,
            "repeats": a.repeats, "chunk": a.chunk, "read_alone_tok_s": read_rows, "profile": profiled, "rows": rows,
            "speedup_vs_one": {str(r["requests"]): round(r["aggregate_tok_s"] / rows[0]["aggregate_tok_s"], 2)
                               for r in rows}}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "gpu"))
    p.add_argument("--batches", default="1,2,4,8,16")
    p.add_argument("--context", type=int, default=512, help="prompt tokens of each request")
    p.add_argument("--steps", type=int, default=64, help="tokens each request decodes per run")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--chunk", type=int, default=512)
    p.add_argument("--weights", choices=("quantized", "fp16"), default="quantized")
    p.add_argument("--reads", help="prompt sizes read alone first, comma-separated (tok/s)")
    p.add_argument("--profile", type=int, help="a prompt of this many tokens read and one step decoded, timed by "
                                                "operation")
    p.add_argument("--label")
    p.add_argument("--json")
    a = p.parse_args()
    result = run(a)
    if a.json:
        merge_result(Path(a.json), a.label or result["model"], result)
    print(json.dumps(result["speedup_vs_one"]))
    return 0 if all(r["tokens_equal_solo"] for r in result["rows"]) else 1  # batch invariance failed


if __name__ == "__main__":
    sys.exit(main())
