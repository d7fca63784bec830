"""The engine router (serve/scheduling/engine_router.py) on an agent trace, CPU only: what one routing decision
costs, and how much of each prompt's start the chosen engine had already read (its prefix-affinity
hit rate), beside round-robin and random placement.

The trace: A agents, each with its own system prompt (S tokens) and turns that grow its conversation
(each turn adds U user tokens and R answer tokens), and each agent's sub-agents, which share the
agent's system prompt and add a task of their own; requests arrive interleaved across agents. An
engine holds a request for `hold` arrivals (its load), and its prefix cache holds the last
`cache_tokens` of prompt blocks it was sent (LRU): a prefix read on two engines takes room on both.

    python bench/routing_bench.py [--engines 2] [--agents 8] [--turns 10] [--json FILE]
"""
from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import sys
import time
from collections import deque
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from serve.scheduling.engine_router import PREFIX_BLOCK, EngineRouter, PrefixRecord, block_chain  # noqa: E402


class Engine:
    """What the router reads of a scheduler: its queues, readiness and free KV blocks."""

    def __init__(self):
        self.waiting, self.running, self.parked = deque(), [], []
        self.ready, self.failed, self.free_blocks = True, False, 1000


def trace(agents: int, turns: int, subagents: int, system: int, user: int, answer: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    words = lambda n: [rng.randrange(100, 49000) for _ in range(n)]  # noqa: E731
    convs = {a: words(system) for a in range(agents)}
    systems = dict(convs)
    events = [(a, t) for a in range(agents) for t in range(turns)]
    rng.shuffle(events)
    events.sort(key=lambda e: e[1])  # turn by turn, agents interleaved
    prompts = []
    for a, t in events:
        convs[a] = convs[a] + words(user)
        prompts.append(list(convs[a]))
        convs[a] += words(answer)
        if t % 3 == 2:  # every third turn the agent sends its sub-agents out
            prompts += [systems[a] + words(user * 2) for _ in range(subagents)]
    return prompts


def run(prompts: list[list[int]], engines: int, policy: str, hold: int, cache_tokens: int) -> dict:
    scheds = [Engine() for _ in range(engines)]
    router = EngineRouter(scheds)  # the real router over stand-in schedulers
    seen = [PrefixRecord(capacity=cache_tokens // PREFIX_BLOCK) for _ in scheds]  # each engine's cache (LRU)
    rng, held, costs, hit_blocks, total_blocks = random.Random(1), deque(), [], 0, 0
    for n, prompt in enumerate(prompts):
        started = time.perf_counter()
        if policy == "router":  # what EngineRouter.submit does
            chain = block_chain(prompt)
            i = router.choose(chain)
            router.records[i].add(chain)
        else:
            i = n % engines if policy == "round_robin" else rng.randrange(engines)
        costs.append(time.perf_counter() - started)
        chain = block_chain(prompt)
        hit_blocks += seen[i].matched(chain)
        total_blocks += len(chain)
        seen[i].add(chain)
        scheds[i].running.append(n)
        held.append(i)
        if len(held) > hold:  # the oldest request ends
            scheds[held.popleft()].running.pop(0)
    return {"requests": len(prompts), "prefix_hit_rate": round(hit_blocks / max(1, total_blocks), 4),
            "decision_us_median": round(statistics.median(costs) * 1e6, 1),
            "decision_us_p99": round(sorted(costs)[int(0.99 * (len(costs) - 1))] * 1e6, 1),
            "routed": router.routed if policy == "router" else None}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--engines", type=int, default=2)
    p.add_argument("--agents", type=int, default=8)
    p.add_argument("--turns", type=int, default=10)
    p.add_argument("--subagents", type=int, default=3)
    p.add_argument("--system", type=int, default=4000, help="tokens of each agent's system prompt")
    p.add_argument("--user", type=int, default=200)
    p.add_argument("--answer", type=int, default=300)
    p.add_argument("--hold", type=int, default=6, help="arrivals a request stays running for (engine load)")
    p.add_argument("--cache-tokens", type=int, default=32768, help="the prefix cache each engine holds (LRU)")
    p.add_argument("--json")
    a = p.parse_args()
    prompts = trace(a.agents, a.turns, a.subagents, a.system, a.user, a.answer, seed=3)
    result = {"machine": f"{platform.processor() or platform.machine()}, Python {platform.python_version()}",
              "trace": {k: getattr(a, k) for k in ("engines", "agents", "turns", "subagents", "system", "user",
                                                   "answer", "hold", "cache_tokens")},
              "mean_prompt_tokens": round(statistics.mean(len(x) for x in prompts)),
              "policies": {policy: run(prompts, a.engines, policy, a.hold, a.cache_tokens)
                           for policy in ("router", "round_robin", "random")}}
    print(json.dumps(result, indent=1))
    if a.json:
        Path(a.json).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
