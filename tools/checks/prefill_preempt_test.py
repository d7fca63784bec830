"""Parity report for prefill preemption, for any model and device: drives `strata --serve
--prefill-preempt` over its pipes and checks that parked-then-resumed requests produce the same
tokens and the same state fingerprint as uninterrupted ones; and that a read whose chunks pause
between layers for three decoding requests (--decode-interval-ms tiny) ends as the uninterrupted
read, the decoders' tokens equal to their solo runs.

    python tools/checks/prefill_preempt_test.py [--model PATH] [--device cpu|gpu] [--chunk 64] [--prompt-tokens 600]
        [--engine-args "--kv-type q8_0"]

Exit status 0 when every scenario matches, 1 otherwise.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from protocol.pipe_client import EnginePipe  # noqa: E402
from tools.checks import preempt_scenarios as sc  # noqa: E402

SAMPLING = {"greedy": {"temperature": 0.0, "seed": 0},
            "seeded": {"temperature": 0.9, "top_p": 0.95, "seed": 1234, "repeat_penalty": 1.1}}


def prompts(n: int) -> tuple[list[int], list[int]]:
    cases = json.loads((ROOT / "tests/fixtures/logits_golden.json").read_text())["cases"]
    long = (cases[3]["ids"] * (n // len(cases[3]["ids"]) + 1))[: n - len(cases[0]["ids"])] + cases[0]["ids"]
    return long, cases[1]["ids"]


def scenarios(chunk: int) -> list[tuple[str, dict]]:
    rows = [(f"park@{b} interim decodes {k}", {"boundaries": [b], "interim_tokens": k})
            for b in (1, 2, 5) for k in (0, 1, 32)]
    rows.append(("pure restore @3", {"boundaries": [3], "interim_tokens": None}))
    rows.append(("three consecutive parks", {"boundaries": [1, 2, 3], "interim_tokens": 1}))
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model")
    p.add_argument("--device", default="auto")
    p.add_argument("--chunk", type=int, default=64)
    p.add_argument("--prompt-tokens", type=int, default=600)
    p.add_argument("--max-new", type=int, default=24)
    p.add_argument("--engine-args", default="", help="more engine flags (e.g. --kv-type q8_0)")
    p.add_argument("--json", help="write the report here too")
    a = p.parse_args()
    cmd = [sys.executable, "-m", "engine", "--serve", "--device", a.device, "--chunk", str(a.chunk),
           "--prefill-preempt", "--prefill-preempt-min-tokens", "0", "--slots", "4", "--decode-interval-ms", "0.01", *a.engine_args.split()] + (["--model", a.model] if a.model else [])
    engine = EnginePipe(cmd, cwd=ROOT)
    engine.handshake()
    long, interim = prompts(a.prompt_tokens)
    report, ok = [], True
    for name, params in SAMPLING.items():
        ref = sc.uninterrupted(engine, long, a.max_new, params)
        for label, kw in scenarios(a.chunk):
            started = time.perf_counter()
            out = sc.parked(engine, long, a.max_new, params, a.chunk, kw["boundaries"], interim, kw["interim_tokens"])
            row = {"sampling": name, "scenario": label, "parked_at": out.parks,
                   "tokens_equal": out.tokens == ref.tokens, "fingerprint_equal": out.done_fp == ref.done_fp,
                   "restore_exact": out.park_fps == out.resume_fps, "s": round(time.perf_counter() - started, 2)}
            ok &= row["tokens_equal"] and row["fingerprint_equal"] and row["restore_exact"]
            report.append(row)
            print(f"{name:7s} {label:28s} parked at {str(out.parks):14s} tokens {row['tokens_equal']!s:5s} "
                  f"fingerprint {row['fingerprint_equal']!s:5s} restore {row['restore_exact']!s:5s} {row['s']}s",
                  flush=True)
    for name, params in SAMPLING.items():  # A reads while three requests decode beside it
        ref = sc.uninterrupted(engine, long, a.max_new, params)
        alone = sc.decoders_alone(engine, params, interim, 3, 64)
        out, beside, inside = sc.read_beside_decoders(engine, long, a.max_new, params, interim, 3, 64)
        row = {"sampling": name, "scenario": "read beside 3 decoders", "decoder_tokens_in_first_chunk": inside,
               "tokens_equal": out.tokens == ref.tokens, "fingerprint_equal": out.done_fp == ref.done_fp,
               "decoders_equal": beside == alone}
        ok &= row["tokens_equal"] and row["fingerprint_equal"] and row["decoders_equal"] and inside > 1
        report.append(row)
        print(json.dumps(row), flush=True)
    done = sc.cancel_while_parked(engine, long, SAMPLING["greedy"], a.chunk)
    decode_out, park_lines = sc.yield_during_decode(engine, long, a.max_new, SAMPLING["greedy"])
    extra = {"cancel_while_parked": done.finish == "cancel", "decode_never_yields": not park_lines}
    ok &= all(extra.values())
    print(json.dumps(extra))
    engine.close()
    if a.json:
        Path(a.json).write_text(json.dumps({"scenarios": report, **extra, "ok": ok}, indent=1) + "\n")
    print("ALL MATCH" if ok else "MISMATCH")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
