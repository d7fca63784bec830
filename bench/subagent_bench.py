"""An agent and its sub-agents on one server: a long shared system prompt, then many requests at
once that share it, each with its own tail. Time to first token (p50, max) and the prompt tokens the
prefix cache saved, through HTTP with the openai client, the server started as a user starts it;
the same requests against a second server with --no-prompt-reuse, in the same run.

    python bench/subagent_bench.py [--device cpu|gpu] [--model PATH] [--system 1500] [--tail 300]
        [--agents 16] [--answer 16] [--repeats 3] [--label NAME --json FILE] [-- server flags...]

Each repeat uses a fresh system prompt (so the warm request really is the first to read it): one
request reads it (the agent), then --agents requests arrive together (the sub-agents).
"""
from __future__ import annotations

import argparse
import concurrent.futures
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import openai

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.engine_bench import machine, merge_result  # noqa: E402
from tests.harness import ServerProcess  # noqa: E402

WORDS = ("alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar papa "
         "quebec romeo sierra tango uniform victor whiskey xray yankee zulu").split()


def text(rng: np.random.Generator, words: int) -> str:
    return " ".join(rng.choice(WORDS, words))


def one(client: openai.OpenAI, system: str, tail: str, answer: int) -> tuple[float, int, int]:
    """(seconds to the first streamed token, prompt tokens, cached tokens)."""
    began = time.perf_counter()
    stream = client.chat.completions.create(
        model="any", messages=[{"role": "system", "content": system}, {"role": "user", "content": tail}],
        max_tokens=answer, temperature=0, stream=True, stream_options={"include_usage": True})
    first, usage = None, None
    for chunk in stream:
        if first is None and chunk.choices and chunk.choices[0].delta.content:
            first = time.perf_counter() - began
        usage = chunk.usage or usage
    details = usage.prompt_tokens_details
    return (first if first is not None else time.perf_counter() - began, usage.prompt_tokens,
            details.cached_tokens if details else 0)


def arm(url: str, a: argparse.Namespace, seed: int) -> dict:
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=600)
    rng = np.random.default_rng(seed)
    system = text(rng, a.system)
    agent = one(client, system, text(rng, a.tail), a.answer)
    tails = [text(rng, a.tail) for _ in range(a.agents)]
    with concurrent.futures.ThreadPoolExecutor(a.agents) as pool:
        subs = list(pool.map(lambda t: one(client, system, t, a.answer), tails))
    ttfts = [s[0] for s in subs]
    return {"agent_ttft_s": round(agent[0], 3), "prompt_tokens": agent[1],
            "ttft_p50_s": round(statistics.median(ttfts), 3), "ttft_max_s": round(max(ttfts), 3),
            "cached_min": min(s[2] for s in subs), "cached_max": max(s[2] for s in subs)}


def run(a: argparse.Namespace, server_flags: list[str]) -> dict:
    out = {"machine": machine(a.device), "agents": a.agents, "system_words": a.system, "tail_words": a.tail,
           "server_flags": server_flags, "arms": {}}
    for name, extra in (("prefix cache (default)", []), ("--no-prompt-reuse", ["--no-prompt-reuse"])):
        flags = ["--device", a.device, *(["--model", a.model] if a.model else []), *server_flags, *extra]
        with ServerProcess(extra=flags).start(timeout_s=600) as server:
            runs = [arm(server.url, a, seed) for seed in range(a.repeats)]
        row = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        row["runs"] = runs
        out["arms"][name] = row
        print(f"{name:24s} agent {row['agent_ttft_s']:.3f} s; {a.agents} sub-agents TTFT p50 {row['ttft_p50_s']:.3f} s "
              f"max {row['ttft_max_s']:.3f} s; cached {row['cached_min']}..{row['cached_max']} of "
              f"{row['prompt_tokens']} prompt tokens", flush=True)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu", choices=("cpu", "gpu"))
    p.add_argument("--model")
    p.add_argument("--system", type=int, default=1500, help="words of the shared system prompt")
    p.add_argument("--tail", type=int, default=300, help="words of each sub-agent's own message")
    p.add_argument("--agents", type=int, default=16)
    p.add_argument("--answer", type=int, default=16)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--label")
    p.add_argument("--json")
    a, server_flags = p.parse_known_args()
    result = run(a, [f for f in server_flags if f != "--"])
    if a.json:
        merge_result(Path(a.json), a.label or f"{a.device} {a.agents} sub-agents", result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
