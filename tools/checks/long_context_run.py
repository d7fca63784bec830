"""Issue 24's longest request, end to end on one engine: the plan for --ctx (1M positions with an 8-bit
cache on one H200 for the Llama-3-8B shape), then a request of --prompt-tokens (262,144) read
uninterrupted, and the same request parked at a chunk boundary half-way while a short request runs,
then resumed: its tokens and its state fingerprint (the cache's rows as stored, the sampler's state)
equal the uninterrupted run's. Decode speed at that depth beside a 512-token request's.

    python tools/checks/long_context_run.py --model FILE [--device gpu] [--kv-type q8_0] [--ctx 1048576]
        [--prompt-tokens 262144] [--chunk 2048] [--max-new 16] [--no-park] [--json OUT]

--no-park: only the plan, the uninterrupted read and decode at its depth (speeds by cache type).

The prompt is random token ids (a synthetic model's output is as checkable as a trained one's for
parity; no tokenizer is needed). Exit status 0 when the parked run equals the uninterrupted one.
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

from bench.engine_bench import machine  # noqa: E402
from protocol.pipe_client import EnginePipe  # noqa: E402
from tools.checks import preempt_scenarios as sc  # noqa: E402

GREEDY = {"temperature": 0.0, "seed": 0}


def rates(out: sc.Outcome) -> dict:
    done = out.done
    return {"prompt_tokens": done.prompt_tokens, "read_s": round(done.prompt_ms / 1e3, 2),
            "read_tok_s": round(done.prompt_tokens / done.prompt_ms * 1e3, 1),
            "decode_tok_s": round(done.generated / done.decode_ms * 1e3, 1) if done.decode_ms else None}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True)
    p.add_argument("--device", default="gpu")
    p.add_argument("--kv-type", default="q8_0")
    p.add_argument("--ctx", type=int, default=1 << 20)
    p.add_argument("--prompt-tokens", type=int, default=1 << 18)
    p.add_argument("--chunk", type=int, default=2048)
    p.add_argument("--max-new", type=int, default=16)
    p.add_argument("--vocab-low", type=int, default=1000, help="prompt ids are drawn from [low, high)")
    p.add_argument("--vocab-high", type=int, default=100000)
    p.add_argument("--no-park", action="store_true", help="skip the parked run")
    p.add_argument("--json")
    a = p.parse_args()
    started = time.perf_counter()
    cmd = [sys.executable, "-m", "engine", "--serve", "--model", a.model, "--device", a.device, "--kv-type", a.kv_type,
           "--ctx", str(a.ctx), "--chunk", str(a.chunk), "--prefill-preempt", "--prefill-preempt-min-tokens", "0"]
    engine = EnginePipe(cmd, cwd=ROOT)
    report: dict = {"machine": machine(a.device), "command": " ".join(cmd[1:])}
    try:
        engine.handshake()
        report["engine_ready_s"] = round(time.perf_counter() - started, 1)
        report["engine_loaded"] = [line.strip() for line in engine.stderr if "strata: loaded" in line]
        report["plan"] = {key: engine.info.get(key) for key in ("ctx", "kv_type", "kv_blocks", "kv_block", "kv_block_bytes",
                                                              "kv_cache_mib", "weights_mib", "device")}
        print("plan:", json.dumps(report["plan"]), flush=True)
        rng = np.random.default_rng(24)
        prompt = rng.integers(a.vocab_low, a.vocab_high, a.prompt_tokens).tolist()
        short = rng.integers(a.vocab_low, a.vocab_high, 512).tolist()
        near = sc.uninterrupted(engine, short, 64, GREEDY)
        report["decode_at_512"] = rates(near)
        print("512-token request:", report["decode_at_512"], flush=True)
        ref = sc.uninterrupted(engine, prompt, a.max_new, GREEDY)
        report["uninterrupted"] = rates(ref)
        print("uninterrupted:", report["uninterrupted"], flush=True)
        if a.no_park:
            return 0
        boundary = a.prompt_tokens // a.chunk // 2
        out = sc.parked(engine, prompt, a.max_new, GREEDY, a.chunk, [boundary], short[:64], 8)
        report["parked"] = rates(out) | {
            "parked_at": out.parks, "tokens_equal": out.tokens == ref.tokens, "fingerprint_equal": out.done_fp == ref.done_fp,
            "restore_exact": out.park_fps == out.resume_fps, "tokens": out.tokens, "reference_tokens": ref.tokens}
        print("parked:", json.dumps(report["parked"]), flush=True)
    finally:
        engine.close()
        report["wall_s"] = round(time.perf_counter() - started, 1)
        if a.json:
            Path(a.json).write_text(json.dumps(report, indent=1) + "\n")
    parked = report.get("parked", {})
    ok = bool(parked) and parked["tokens_equal"] and parked["fingerprint_equal"] and parked["restore_exact"]
    print("PARITY OK" if ok else "PARITY FAILED", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
