"""Strict FIFO (--no-prefill-preempt) over the mock engine, and clients that leave while queued or while running."""
import time

import httpx
import pytest

from tests.harness import ServerProcess, mock_engine_cmd
from tests.serve.helpers import Background, complete_tokens, metrics, post_and_leave

SLOW = mock_engine_cmd("--chunk", "64", "--chunk-s", "0.05", "--token-s", "0.01")


def wait_for(predicate, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.02)
    raise AssertionError("condition not reached in time")


def status(server) -> dict:
    return httpx.get(server.url + "/status").json()


@pytest.fixture(scope="module")
def fifo():
    """A strict-FIFO server, shared by the cases that count nothing over the server's life."""
    with ServerProcess(engine_cmd=SLOW, extra=["--no-prefill-preempt"]) as server:
        yield server


def test_requests_are_served_in_arrival_order(fifo):
    server = fifo
    finished = []

    def run(i):
        r = complete_tokens(server.url, 1280, max_tokens=2)
        finished.append(i)
        return r

    threads = []
    for i in range(4):
        threads.append(Background(run, i))
        threads[-1].start()
        # each one is in (queued or running) before the next is sent
        wait_for(lambda n=i + 1: status(server)["queued"] + status(server)["busy"] + len(finished) == n)
    assert [t.get().status_code for t in threads] == [200] * 4
    assert finished == [0, 1, 2, 3]


def test_client_leaving_while_queued_never_reaches_the_engine(server_factory):
    # A reads for ~4 s, long past the other client's leaving even on a loaded machine
    slower = mock_engine_cmd("--chunk", "64", "--chunk-s", "0.2", "--token-s", "0.01")
    server = server_factory(engine_cmd=slower, extra=["--no-prefill-preempt"])
    a = Background(complete_tokens, server.url, 1280, 2)
    a.start()
    wait_for(lambda: status(server)["busy"])
    post_and_leave(server.url, after_s=0.3)
    wait_for(lambda: status(server)["queued"] == 0)
    assert a.get().status_code == 200
    m = metrics(server.url)
    assert m["strata_queue_wait_seconds_count"] == 1  # only A ever reached the engine
    assert m["strata_requests_total{finish_reason=cancelled}"] == 1
    assert complete_tokens(server.url, 10, 2).status_code == 200


def test_client_leaving_while_running_stops_the_engine(server_factory):
    server = server_factory(engine_cmd=SLOW, extra=["--no-prefill-preempt"])
    with httpx.stream("POST", server.url + "/v1/completions", timeout=30,
                      json={"prompt": list(range(100, 200)), "max_tokens": 5000, "stream": True}) as r:
        for line in r.iter_lines():
            if '"text"' in line:
                break  # got a token: now leave
    started = time.monotonic()
    wait_for(lambda: not status(server)["busy"], timeout_s=5)
    assert time.monotonic() - started < 5  # 5000 tokens would take 50 s
    m = metrics(server.url)
    assert m["strata_generated_tokens_total"] < 5000
    assert complete_tokens(server.url, 10, 2).status_code == 200


def test_non_streaming_client_leaving_while_running_frees_the_engine(fifo):
    server = fifo
    try:
        httpx.post(server.url + "/v1/completions", json={"prompt": "x", "max_tokens": 3000}, timeout=0.5)
    except httpx.ReadTimeout:
        pass
    wait_for(lambda: not status(server)["busy"], timeout_s=5)
    assert complete_tokens(server.url, 10, 2).status_code == 200
