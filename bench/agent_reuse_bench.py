"""An agent's conversation re-sent every turn: time to first token with prompt reuse and without.

    python bench/agent_reuse_bench.py [--model PATH] [--device cpu|gpu] [--turns 10] [--final 16384]
        [--chunk 2048] [--answer 16] [--label NAME --json FILE]

Drives `strata --serve` over its pipes. Turn t's prompt is turn t-1's prompt, its answer, and a new
message (random token ids), so that it grows to about --final tokens by the last turn. Each turn runs
twice: first with reuse (a slot kept the previous turn's conversation, so only what is new is read,
from a chunk boundary), then with reuse=0 (the whole prompt read cold, in the other slot). Reports
per turn the time from GEN to the first token of each arm, the tokens reused, and the ratio (one
run per turn: a second reuse run of the same turn would find the turn itself kept).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.engine_bench import merge_result  # noqa: E402
from protocol import messages as m  # noqa: E402
from tests.harness import PY, EngineProcess  # noqa: E402


def ttft(engine: EngineProcess, ident: int, prompt: tuple[int, ...], answer: int, reuse: int):
    """(seconds from GEN to the first T, tokens reused, the answer's tokens)."""
    began = time.perf_counter()
    engine.send(m.Gen(answer, prompt, {"temperature": 0.0, "seed": 0, "reuse": reuse}, ident))
    seen = engine.read_until(m.Token, ident=ident)
    first = time.perf_counter() - began
    seen += engine.read_until(m.Done, ident=ident)
    cached = next(int(x.fields["cached"]) for x in seen if isinstance(x, m.Info) and "cached" in x.fields)
    return first, cached, tuple(x.token for x in seen if isinstance(x, m.Token))


def run(a: argparse.Namespace) -> dict:
    cmd = [PY, "-m", "engine", "--serve", "--device", a.device, "--chunk", str(a.chunk), "--slots", "2",
           "--ctx", str((a.final + 4096) // 256 * 256)] + (["--model", a.model] if a.model else [])
    engine = EngineProcess(cmd)
    engine.handshake()
    info = engine.info
    rng = np.random.default_rng(0)
    step = a.final // a.turns
    prompt, ident, rows = (), 0, []
    for turn in range(1, a.turns + 1):
        prompt = prompt + tuple(int(t) for t in rng.integers(100, 20000, step))
        reuse_s, cached, answer = ttft(engine, ident + 1, prompt, a.answer, 1)
        cold_s, _, cold_answer = ttft(engine, ident + 2, prompt, a.answer, 0)
        ident += 2
        assert cold_answer == answer, "a reused read must answer as a cold one"
        row = {"turn": turn, "prompt_tokens": len(prompt), "reused_tokens": cached,
               "ttft_s_reuse": round(reuse_s, 4), "ttft_s_cold": round(cold_s, 4)}
        row["speedup"] = round(row["ttft_s_cold"] / row["ttft_s_reuse"], 2)
        rows.append(row)
        print(f"turn {turn:2d}: {len(prompt):6d} tokens, {cached:6d} reused, TTFT {row['ttft_s_reuse']:.3f} s "
              f"with reuse vs {row['ttft_s_cold']:.3f} s cold ({row['speedup']}x)", flush=True)
        prompt = prompt + answer
    engine.close()
    return {"device": info.get("device"), "model": info.get("model"), "chunk": a.chunk, "turns": a.turns,
            "rows": rows}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model")
    p.add_argument("--device", default="cpu", choices=("cpu", "gpu"))
    p.add_argument("--turns", type=int, default=10)
    p.add_argument("--final", type=int, default=16384, help="about the last turn's prompt tokens")
    p.add_argument("--chunk", type=int, default=2048)
    p.add_argument("--answer", type=int, default=16, help="tokens each turn answers")
    p.add_argument("--label")
    p.add_argument("--json")
    a = p.parse_args()
    result = run(a)
    if a.json:
        merge_result(Path(a.json), a.label or str(result["model"]), result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
