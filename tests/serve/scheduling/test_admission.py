"""Several clients on one pool of KV blocks: requests decode together (the real engine on the CPU,
with the openai client), a newcomer starts while everyone else decodes, the prefix cache across a
conversation's turns and across requests that share a system prompt, the pool in /status and
/metrics; and the scheduler's invariants over random arrivals, priorities and departures with a
pool too small for all of them (mock engine, driven by hypothesis: DEFER and pauses, nothing lost)."""
from __future__ import annotations

import concurrent.futures
import threading
import time

import httpx
import openai
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from tests.harness import ServerProcess, mock_engine_cmd
from tests.serve.helpers import metrics
from tests.serve.scheduling.test_scheduling import status, wait_for

QUESTIONS = ["What is the capital of France?", "Name three colors.", "What is 2 + 2?", "Say hello in Spanish.",
             "What is the largest ocean?", "Name a fruit.", "How many days are in a week?", "What color is the sky?"]


@pytest.fixture(scope="module")
def server():
    with ServerProcess(extra=["--device", "cpu", "--chunk", "64"]).start(timeout_s=300) as s:
        yield s


def ask(client: openai.OpenAI, messages: list[dict], max_tokens: int = 16):
    return client.chat.completions.create(model="any", messages=messages, max_tokens=max_tokens, temperature=0)


def test_concurrent_greedy_requests_equal_their_solo_texts(server):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    chats = [[{"role": "user", "content": q}] for q in QUESTIONS]
    solo = [ask(client, c).choices[0].message.content for c in chats]
    most_running, done = [0], threading.Event()

    def watch():
        while not done.is_set():
            most_running[0] = max(most_running[0], len(status(server)["running"]))
            time.sleep(0.01)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        together = [r.choices[0].message.content for r in pool.map(lambda c: ask(client, c), chats)]
    done.set()
    watcher.join()
    assert together == solo
    assert most_running[0] >= 5  # more than the four slots there used to be, in the engine at once
    wait_for(lambda: metrics(server.url)["strata_kv_blocks{state=used}"] == 0, timeout_s=10)
    m = metrics(server.url)
    assert sum(m[f"strata_running_requests{{state={s}}}"] for s in ("reading", "decoding", "paused")) == 0
    kv = status(server)["kv"]
    assert kv["used"] == 0 and kv["kv_blocks"] == kv["free"] + kv["idle"] and kv["bytes_per_token"] > 0


def test_a_newcomer_starts_while_everyone_else_decodes(server):
    """Four clients stream long answers; a fifth, short request sent while they decode gets its first
    token before any of them has finished (no slot to wait for: the pool has room)."""
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    order, lock, decoding = [], threading.Lock(), threading.Barrier(5)

    def note(event: str) -> None:
        with lock:
            order.append(event)

    def decoder(i: int) -> None:
        # counting goes on: a greedy continuation of it does not stop before max_tokens
        stream = client.completions.create(model="any", prompt=f"{i}, " + ", ".join(str(n) for n in range(i + 1, i + 9)),
                                           max_tokens=64, temperature=0, stream=True)
        started, finish = False, None
        for chunk in stream:
            if not started and chunk.choices and chunk.choices[0].text:
                started = True
                decoding.wait(120)
            finish = (chunk.choices[0].finish_reason if chunk.choices else None) or finish
        note(f"decoder {i} done ({finish})")

    threads = [threading.Thread(target=decoder, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    decoding.wait(120)  # all four are decoding
    stream = client.chat.completions.create(model="any", messages=[{"role": "user", "content": "Hi"}], max_tokens=4,
                                            temperature=0, stream=True)
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            note("newcomer's first token")
            break
    stream.close()
    for t in threads:
        t.join(300)
    assert order[0] == "newcomer's first token", order


def test_requests_sharing_a_system_prompt_reuse_it_from_one_another(server):
    """Sub-agents: the same long system prompt, each its own question; the second and later ones find
    the first one's whole chunks in the prefix cache (cached_tokens), and answer as a cold read does."""
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    system = {"role": "system", "content": "You are a careful sub-agent of a coding assistant. " * 12}
    first = ask(client, [system, {"role": "user", "content": "Name a sorting algorithm."}])
    second = ask(client, [system, {"role": "user", "content": "Name a data structure."}])
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached >= 64 and cached % 64 == 0


def test_the_next_turn_reuses_the_conversation_from_the_prefix_cache(server):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    history = [{"role": "system", "content": "You are a helpful assistant. " * 20},
               {"role": "user", "content": "What is the capital of France?"}]
    first = ask(client, history)
    before = metrics(server.url)
    history += [{"role": "assistant", "content": first.choices[0].message.content},
                {"role": "user", "content": "And of Italy?"}]
    second = ask(client, history)
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached >= 64 and cached % 64 == 0 and cached < second.usage.prompt_tokens
    after = metrics(server.url)
    assert after["strata_prompt_reuse_hits_total"] == before["strata_prompt_reuse_hits_total"] + 1
    assert after["strata_prompt_reused_tokens_total"] == before["strata_prompt_reused_tokens_total"] + cached


# ---------------------------------------------------------------- the scheduler over random arrivals

@pytest.fixture(scope="module")
def mock_server():
    """Four running at most, over a pool of 384 tokens: two long prompts do not fit beside each other;
    a host tier of 64 blocks (16 tokens of 1 KiB each) keeps what the pool evicts."""
    cmd = mock_engine_cmd("--max-running", "4", "--kv-tokens", "384", "--chunk", "16", "--chunk-s", "0.01",
                          "--token-s", "0.01", "--cache-ram", str(64 * 16 * 1024 / 2**30))
    with ServerProcess(engine_cmd=cmd, extra=["--prefill-preempt-aged-s", "0.5"]).start() as s:
        yield s


ARRIVAL = st.tuples(st.integers(1, 300), st.integers(0, 1), st.sampled_from(["stay", "leave"]),
                    st.floats(0, 0.15))  # prompt tokens, priority, whether the client leaves early, delay


@settings(max_examples=4, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(ARRIVAL, min_size=3, max_size=7))
def test_every_request_is_answered_once_and_nothing_is_left_behind(mock_server, arrivals):
    """Random arrivals (lengths, priorities, delays) with clients that leave, over a pool too small for
    all of them: every client that stays gets exactly its answer (the mock echoes its prompt),
    nothing deadlocks, and once all is done no request is running, parked or waiting and no block
    is held."""
    results, leavers = {}, []

    def client(i: int, n: int, priority: int):
        prompt = list(range(1000 + i * 500, 1000 + i * 500 + n))
        r = httpx.post(f"{mock_server.url}/v1/completions", timeout=60,
                       json={"prompt": prompt, "max_tokens": 6, "priority": priority})
        results[i] = (r.status_code, r.json() if r.status_code == 200 else r.text, prompt)

    def leaver(i: int, n: int):
        prompt = list(range(1000 + i * 500, 1000 + i * 500 + n))
        try:
            httpx.post(f"{mock_server.url}/v1/completions", timeout=0.05, json={"prompt": prompt, "max_tokens": 50})
        except httpx.TimeoutException:
            pass

    threads = []
    for i, (n, priority, kind, delay) in enumerate(arrivals):
        time.sleep(delay)
        t = threading.Thread(target=client if kind == "stay" else leaver,
                             args=(i, n, priority) if kind == "stay" else (i, n))
        t.start()
        threads.append(t)
        if kind == "leave":
            leavers.append(i)
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "a client never got its answer"
    wait_for(lambda: not status(mock_server)["busy"] and not status(mock_server)["parked"], timeout_s=20)
    for i, (code, body, prompt) in results.items():
        assert code == 200, body
        usage = body["usage"]  # the whole answer: the mock's six tokens, for the whole prompt
        assert (usage["prompt_tokens"], usage["completion_tokens"]) == (len(prompt), 6)
        assert body["choices"][0]["finish_reason"] == "length"
    assert len(results) == len(arrivals) - len(leavers)
    s = status(mock_server)
    assert (s["queued"], s["running"], s["parked"], s["waiting"]) == (0, [], [], [])
    wait_for(lambda: metrics(mock_server.url)["strata_kv_blocks{state=used}"] == 0, timeout_s=10)
    assert metrics(mock_server.url)["strata_parked_requests"] == 0


def test_a_pool_too_small_for_everyone_defers_and_answers_all(mock_server):
    """Six 300-token prompts at once over 384 tokens of KV: the reads cannot all hold their rows, so
    requests are paused into host memory or deferred (DEFER memory) and go on as others end; every
    one is answered whole."""
    kv = status(mock_server)["kv"]
    before = kv.get("pauses", 0) + kv.get("deferred", 0)
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        codes = list(pool.map(lambda i: httpx.post(f"{mock_server.url}/v1/completions", timeout=60, json={
            "prompt": list(range(5000 + 400 * i, 5300 + 400 * i)), "max_tokens": 40}).status_code, range(6)))
    assert codes == [200] * 6
    kv = status(mock_server)["kv"]
    assert kv.get("pauses", 0) + kv.get("deferred", 0) > before


def test_an_evicted_conversation_comes_back_from_the_host_tier(mock_server):
    """A 200-token prompt, then one that needs the whole pool (its blocks are evicted into the host
    tier), then the first again: its start is copied back, not read again, and /status and /metrics
    say so."""
    def complete(prompt):
        r = httpx.post(f"{mock_server.url}/v1/completions", timeout=60, json={"prompt": prompt, "max_tokens": 4})
        assert r.status_code == 200, r.text
        return r.json()["usage"]

    first = list(range(20000, 20200))
    complete(first)
    before = status(mock_server)["kv"]
    complete(list(range(30000, 30370)))  # 370 of the pool's 384 tokens
    kv = status(mock_server)["kv"]
    assert kv["host_stored"] > before.get("host_stored", 0) and kv["host_blocks"] > 0
    m_before = metrics(mock_server.url)
    usage = complete(first)
    assert usage["prompt_tokens_details"]["cached_tokens"] == 192  # twelve whole chunks of 16, short of the last token
    after = status(mock_server)["kv"]
    assert after["prefix_cache"]["tokens_from_host"] - before["prefix_cache"]["tokens_from_host"] == 192
    assert after["host_loaded"] > before.get("host_loaded", 0) and after["cache_ram_blocks"] == 64
    m_after = metrics(mock_server.url)
    assert m_after["strata_prompt_reused_from_host_tokens_total"] > m_before["strata_prompt_reused_from_host_tokens_total"]
    assert m_after["strata_kv_host_blocks{state=capacity}"] == 64
