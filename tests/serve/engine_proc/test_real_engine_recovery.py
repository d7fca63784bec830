"""The real engine killed with SIGKILL while a request reads, while it is parked, and while it
decodes: every answer (greedy, and a seeded stream) equals the uninterrupted run's, a stream shows each piece once."""
import os
import signal

import httpx
import pytest

from tests.harness import ServerProcess
from tests.serve.helpers import Background, metrics, sse_chunks
from tests.serve.scheduling.test_scheduling import status, wait_for

LONG = "The keeper climbed the stairs of the lighthouse at dusk and lit the lamp. " * 45  # ~730 tokens: 3 chunks
SHORT = "Name three rivers of Europe."


@pytest.fixture(scope="module")
def server():
    # each case reads the same long prompt twice and kills the engine during the second read: no reuse;
    # one slot, so that a parked read is moved out of the engine's only slot for the short request
    with ServerProcess(extra=["--device", "cpu", "--ctx", "4096", "--chunk", "256", "--no-prompt-reuse",
                              "--slots", "1"]) as s:
        yield s


@pytest.fixture(scope="module")
def whole_long(server) -> str:
    """The long prompt's uninterrupted answer (16 tokens, greedy), read once for the cases that kill its read."""
    return answer(ask(server, LONG, 16))


def ask(server, text: str, max_tokens: int, sampling: dict | None = None) -> httpx.Response:
    return httpx.post(server.url + "/v1/chat/completions", timeout=120, json={
        "messages": [{"role": "user", "content": text}], "max_tokens": max_tokens} | (sampling or {"temperature": 0}))


def answer(r: httpx.Response) -> str:
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["message"]["content"]


def kill_engine(server) -> None:
    restarts = metrics(server.url)["strata_engine_restarts_total"]
    for pid in server.engine_pids():
        os.kill(pid, signal.SIGKILL)
    wait_for(lambda: metrics(server.url)["strata_engine_restarts_total"] == restarts + 1)


def reading(server) -> bool:
    progress = status(server)["prompt_progress"] or {}
    return status(server)["phase"] == "reading" and progress.get("done", 0) >= 256


def test_killed_while_reading(server, whole_long):
    whole = whole_long
    a = Background(ask, server, LONG, 16)
    a.start()
    wait_for(lambda: reading(server), timeout_s=60)
    kill_engine(server)
    r = a.get()
    assert answer(r) == whole and r.json()["timings"]["engine_restarts"] == 1


def test_killed_while_one_read_is_parked_and_another_request_decodes(server, whole_long):
    whole_a, whole_b = whole_long, answer(ask(server, SHORT, 48))
    a = Background(ask, server, LONG, 16)
    a.start()
    wait_for(lambda: reading(server), timeout_s=60)
    b = Background(ask, server, SHORT, 48)
    b.start()
    wait_for(lambda: status(server)["parked"] != [] and status(server)["phase"] == "decoding", timeout_s=60)
    kill_engine(server)
    assert answer(b.get()) == whole_b and answer(a.get()) == whole_a


@pytest.mark.parametrize("sampling", [{"temperature": 0}, {"temperature": 0.9, "top_p": 0.95, "seed": 11}],
                         ids=["greedy", "seeded"])
def test_killed_while_decoding_a_stream(server, sampling):
    """A seeded answer too: the new engine's GEN carries the tokens so far and how many draws were made
    (`drawn`), so the sampler goes on from the same place in its random stream."""
    whole = answer(ask(server, SHORT, 40, sampling))
    pieces = []
    body = {"messages": [{"role": "user", "content": SHORT}], "max_tokens": 40} | sampling
    for chunk in sse_chunks(server.url, "/v1/chat/completions", body):
        pieces.append(chunk["choices"][0]["delta"].get("content") or "")
        if len([p for p in pieces if p]) == 5:
            kill_engine(server)  # five pieces shown: the rest comes from a new engine
        if chunk["choices"][0]["finish_reason"]:
            assert chunk["timings"]["engine_restarts"] == 1
    assert "".join(pieces) == whole
