"""Several clients at once: requests decode together in the engine's slots (the real engine on the
CPU, with the openai client), prompt reuse across a conversation's turns, the slots in /status and
/metrics; and the scheduler's invariants over random arrivals, priorities and departures (mock
engine with slots, driven by hypothesis)."""
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
from tests.serve.test_scheduling import status, wait_for

QUESTIONS = ["What is the capital of France?", "Name three colors.", "What is 2 + 2?", "Say hello in Spanish."]


@pytest.fixture(scope="module")
def server():
    with ServerProcess(extra=["--device", "cpu", "--slots", "4", "--chunk", "64"]).start(timeout_s=300) as s:
        yield s


def ask(client: openai.OpenAI, messages: list[dict], max_tokens: int = 24):
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
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        together = [r.choices[0].message.content for r in pool.map(lambda c: ask(client, c), chats)]
    done.set()
    watcher.join()
    assert together == solo
    assert most_running[0] >= 2  # they were in the engine at the same time
    m = metrics(server.url)
    assert m["strata_running_requests"] == 0 and m["strata_slots{state=free}"] == 4


def test_the_next_turn_reuses_the_conversation_kept_in_a_slot(server):
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
    cmd = mock_engine_cmd("--slots", "2", "--chunk", "16", "--chunk-s", "0.01", "--token-s", "0.01")
    with ServerProcess(engine_cmd=cmd, extra=["--prefill-preempt-aged-s", "0.5"]).start() as s:
        yield s


ARRIVAL = st.tuples(st.integers(1, 400), st.integers(0, 1), st.sampled_from(["stay", "leave"]),
                    st.floats(0, 0.15))  # prompt tokens, priority, whether the client leaves early, delay


@settings(max_examples=4, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(ARRIVAL, min_size=3, max_size=7))
def test_every_request_is_answered_once_and_nothing_is_left_behind(mock_server, arrivals):
    """Random arrivals (lengths, priorities, delays) with clients that leave: every client that
    stays gets exactly its answer (the mock echoes its prompt), nothing deadlocks, and once all
    is done no request is running, parked or waiting and every slot is free."""
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
    m = metrics(mock_server.url)
    assert m["strata_slots{state=free}"] == 2 and m["strata_parked_requests"] == 0
