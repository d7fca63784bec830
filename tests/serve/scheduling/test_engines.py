"""One server, several engines (--engines N; on this machine N NumPy engines, or mock ones for timing):
routed output equals one engine's, requests sharing a prompt's start go to the engine that read it,
a busy engine is avoided, killing one engine loses no request, and preemption still cuts a short
request's wait on each engine. Plus the router's prefix record on its own."""
from __future__ import annotations

import concurrent.futures as cf
import os
import signal
import time

import httpx
import pytest

from serve.scheduling.engine_router import PrefixRecord, block_chain
from tests.harness import ServerProcess, mock_engine_cmd

MODEL = "SmolLM2-135M-Instruct.Q4_1"


def chat(url: str, text: str, max_tokens: int = 8, system: str | None = None) -> dict:
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": text}]
    r = httpx.post(f"{url}/v1/chat/completions", timeout=120,
                   json={"model": MODEL, "messages": messages, "max_tokens": max_tokens, "temperature": 0})
    assert r.status_code == 200, r.text
    return r.json()


def per_engine(url: str, key: str) -> list:
    return [e[key] for e in httpx.get(f"{url}/status", timeout=10).json()["engines"]]


def lookups(url: str) -> list[int]:
    return [e["kv"]["prefix_cache"]["lookups"] for e in httpx.get(f"{url}/status", timeout=10).json()["engines"]]


def test_the_prefix_record_matches_whole_leading_blocks():
    chain = lambda tokens: block_chain(tokens, block=4)  # noqa: E731
    record = PrefixRecord(capacity=3)
    record.add(chain(list(range(10))))  # blocks [0..3], [4..7]; the tail of 2 is not a block
    assert record.matched(chain(list(range(12)))) == 2
    assert record.matched(chain([0, 1, 2, 3, 9, 9, 9, 9])) == 1  # chained: a later block counts only after its prefix
    assert record.matched(chain([9, 1, 2, 3])) == 0
    record.add(chain([50, 51, 52, 53, 60, 61, 62, 63]))  # capacity 3: the oldest block goes
    assert record.matched(chain(list(range(8)))) == 0 and record.matched(chain([50, 51, 52, 53])) == 1


def test_two_numpy_engines_answer_as_one_and_keep_an_agents_turns_together():
    system = "You are a careful assistant who answers in one short sentence. " * 12  # > two chunks of 64
    with ServerProcess(extra=["--device", "cpu", "--chunk", "64"]) as one:
        alone = [chat(one.url, f"What is {n} + {n}?", system=system)["choices"][0]["message"]["content"]
                 for n in range(3)]
    with ServerProcess(extra=["--device", "cpu", "--chunk", "64", "--engines", "2"]) as two:
        status = httpx.get(f"{two.url}/status").json()
        assert len(status["engines"]) == 2 and all(e["engine"] == "ready" for e in status["engines"])
        routed = [chat(two.url, f"What is {n} + {n}?", system=system)["choices"][0]["message"]["content"]
                  for n in range(3)]
        assert routed == alone  # the same greedy text from whichever engine
        assert sorted(lookups(two.url)) == [0, 3]  # the turns share a system prompt: one engine read it
        engines = httpx.get(f"{two.url}/status").json()["engines"]
        cached = [r for e in engines for r in [e["kv"]["prefix_cache"]["tokens_reused"]]]
        assert max(cached) > 0  # and its prefix cache served the later turns
        loads = httpx.get(f"{two.url}/v1/loads").json()
        assert loads["dp_rank_count"] == 2 and [r["dp_rank"] for r in loads["loads"]] == [0, 1]


LONG_TOKENS = 150  # 3 s at 0.02 s a token: busy long after the short request's 5 tokens


def test_a_busy_engine_is_avoided():
    cmd = mock_engine_cmd("--token-s", "0.02", "--script", "28,29,30")
    with ServerProcess(engine_cmd=cmd, extra=["--engines", "2"]) as server, cf.ThreadPoolExecutor(2) as pool:
        long = pool.submit(chat, server.url, "a long answer", LONG_TOKENS)
        deadline = time.monotonic() + 10
        while sum(per_engine(server.url, "busy")) == 0:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        busy = per_engine(server.url, "busy").index(True)
        short = chat(server.url, "a different question entirely", 5)
        assert short["usage"]["completion_tokens"] == 5
        assert lookups(server.url)[1 - busy] == 1  # the short one ran on the idle engine
        assert not long.done()  # beside the long one, not after it
        assert long.result()["usage"]["completion_tokens"] == LONG_TOKENS


def test_killing_one_engine_loses_no_request():
    cmd = mock_engine_cmd("--token-s", "0.01", "--script", "28,29,30")
    with ServerProcess(engine_cmd=cmd, extra=["--engines", "2"]) as server, cf.ThreadPoolExecutor(6) as pool:
        futures = [pool.submit(chat, server.url, f"question {i} " * (i + 1), 60) for i in range(6)]
        deadline = time.monotonic() + 10
        while sum(per_engine(server.url, "busy")) < 2:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        victim = max(server.engine_pids())
        os.kill(victim, signal.SIGKILL)
        answers = [f.result(timeout=120) for f in futures]
        assert all(a["usage"]["completion_tokens"] == 60 for a in answers)
        assert sum(a["timings"]["engine_restarts"] for a in answers) >= 1  # some lived through the death
        assert httpx.get(f"{server.url}/health").status_code == 200


def test_preemption_cuts_a_short_requests_wait_on_each_engine():
    cmd = mock_engine_cmd("--chunk-s", "0.05", "--token-s", "0.005")
    with ServerProcess(engine_cmd=cmd, extra=["--engines", "2"]) as server, cf.ThreadPoolExecutor(4) as pool:
        # no shared start (else both would go where the first was read): one read on each engine
        reads = [pool.submit(chat, server.url, f"reader {i}: " + "read " * 2000, 4) for i in range(2)]
        deadline = time.monotonic() + 10
        while sum(p is not None for p in per_engine(server.url, "prompt_progress")) < 2:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        started = time.monotonic()
        shorts = [pool.submit(chat, server.url, f"short {i}", 4) for i in range(2)]
        waits = [s.result(timeout=60)["timings"]["queue_wait_ms"] for s in shorts]
        short_done = time.monotonic() - started
        long_reads = [r.result(timeout=120) for r in reads]
        assert all(r["timings"]["parks"] >= 1 for r in long_reads)  # each engine parked its read
        assert max(waits) < 1000 and short_done < min(r["timings"]["prompt_ms"] for r in long_reads) / 1000


@pytest.mark.parametrize("argv, message", [(["--engines", "0"], "--engines must be >= 1"),
                                           (["--engines", "3", "--gpus", "0,1"], "--gpus names 2 GPUs for 3 engines")])
def test_bad_engine_counts_are_refused(argv, message):
    import subprocess
    import sys

    run = subprocess.run([sys.executable, "-m", "serve", *argv], capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and message in run.stderr
