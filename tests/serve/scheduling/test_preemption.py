"""Prefill preemption (on by default) over the mock engine: parks, resumes, FIFO among waiters, cancellations,
faults, shutdown, metrics, fairness; and preemption off (or not offered) stays strict FIFO."""
import os
import signal
import threading
import time

import httpx
import pytest

from tests.harness import ServerProcess, mock_engine_cmd
from tests.serve.helpers import Background, complete_tokens, metrics, post_and_leave
from tests.serve.scheduling.test_scheduling import status, wait_for

LONG = 2560  # prompt tokens of A: 40 chunks of 64 at 0.05 s = 2 s of reading


def preempt_cmd(*engine_args) -> str:
    """Preemption is on by default, in the server and in the engine: no flag needed. These cases
    send the same long prompt more than once and want each read cold: no prompt reuse."""
    return mock_engine_cmd("--chunk", "64", "--chunk-s", "0.05", "--token-s", "0.01", "--no-prompt-reuse", *engine_args)


def preempt_server(server_factory, *engine_args, server_args=()):
    return server_factory(engine_cmd=preempt_cmd(*engine_args), extra=list(server_args))


@pytest.fixture(scope="module")
def preempting():
    """preempt_server's default server, shared by the cases that count nothing over the server's life."""
    with ServerProcess(engine_cmd=preempt_cmd()) as server:
        yield server


def start_a(server, max_tokens: int = 3) -> Background:
    a = Background(complete_tokens, server.url, LONG, max_tokens)
    a.start()
    wait_for(lambda: (status(server)["prompt_progress"] or {}).get("done", 0) > 0)
    return a


def timed(fn, *args, **kwargs):
    result = fn(*args, **kwargs)
    return result, time.monotonic()


def test_no_contention_means_no_park(server_factory):
    server = preempt_server(server_factory)
    assert complete_tokens(server.url, LONG, 3).status_code == 200
    m = metrics(server.url)
    assert m["strata_prefill_preemptions_total"] == 0 and m["strata_prefill_resumes_total"] == 0


def test_a_queued_request_parks_the_read_and_runs_first(server_factory):
    server = preempt_server(server_factory)
    alone = complete_tokens(server.url, LONG, 5).json()["choices"][0]["text"]
    a = Background(timed, complete_tokens, server.url, LONG, 5)
    a.start()
    wait_for(lambda: (status(server)["prompt_progress"] or {}).get("done", 0) >= 640)
    b_sent = time.monotonic()
    b = complete_tokens(server.url, 20, 2)
    b_done = time.monotonic()
    assert b.status_code == 200
    assert b_done - b_sent < 1.0  # one chunk (0.05 s) + B's own service, not A's remaining 1.5 s
    a_response, a_done = a.get()
    assert a_done > b_done
    assert a_response.json()["choices"][0]["text"] == alone  # the resumed read gives the same text
    assert a_response.json()["timings"]["parks"] == 1 and a_response.json()["timings"]["parked_ms"] > 0
    assert b.json()["timings"]["queue_wait_ms"] < 1000 and b.json()["timings"]["parks"] == 0
    m = metrics(server.url)
    assert m["strata_prefill_preemptions_total"] == 1 and m["strata_prefill_resumes_total"] == 1
    assert m["strata_parked_requests"] == 0 and m["strata_park_duration_seconds_count"] == 1


def test_status_shows_the_parked_request(preempting):
    server = preempting
    a = start_a(server)
    b = Background(complete_tokens, server.url, 20, 100)  # ~1 s of decoding
    b.start()
    wait_for(lambda: status(server)["parked"] != [])
    parked = status(server)["parked"][0]
    assert status(server)["parked_requests"] == 1
    assert parked["total"] == LONG and 0 < parked["done"] < LONG and parked["parks"] == 1
    assert metrics(server.url)["strata_parked_requests"] == 1
    assert b.get().status_code == 200 and a.get().status_code == 200


def test_the_parked_read_waits_until_the_request_it_made_way_for_is_done(server_factory):
    """With slots to spare, the parked read does not resume beside B as soon as B has read: B
    decodes on a quiet engine (its tokens do not wait for A's chunks), and A resumes at B's end."""
    server = preempt_server(server_factory, "--slots", "3")
    a = start_a(server)
    b = Background(complete_tokens, server.url, 20, 150)  # 150 tokens at 0.01 s: 1.5 s of decoding, watched
    b.start()
    # B goes in at once (a slot is free) and A parks at its next chunk boundary: watch from then on
    wait_for(lambda: status(server)["parked"] != [])
    beside = []
    while b.is_alive():
        running = status(server)["running"]
        if any(r["total"] == 20 for r in running):
            beside.append(any(r["total"] == LONG for r in running))
        time.sleep(0.02)
    assert len(beside) > 5 and not any(beside)  # B was seen running, never with A
    assert b.get().status_code == 200 and a.get().json()["timings"]["parks"] == 1


def test_waiters_run_in_fifo_order_before_the_parked_read(preempting):
    server = preempting
    a = Background(timed, complete_tokens, server.url, LONG, 3)
    a.start()
    wait_for(lambda: (status(server)["prompt_progress"] or {}).get("done", 0) > 0)
    b = Background(timed, complete_tokens, server.url, 20, 30)
    b.start()
    wait_for(lambda: status(server)["parked"] != [])
    c = Background(timed, complete_tokens, server.url, 20, 30)
    c.start()
    (rb, tb), (rc, tc), (ra, ta) = b.get(), c.get(), a.get()
    assert [r.status_code for r in (ra, rb, rc)] == [200] * 3
    assert tb < tc < ta


def test_a_waiter_leaving_before_the_boundary_withdraws_the_park(server_factory):
    server = server_factory(engine_cmd=mock_engine_cmd("--chunk", "64", "--chunk-s", "1.5"))
    a = Background(complete_tokens, server.url, 256, 3)
    a.start()
    # the waiter comes as a chunk begins: 1.5 s to its boundary, to leave in and be noticed on a busy machine
    wait_for(lambda: (status(server)["prompt_progress"] or {}).get("done", 0) >= 64)
    post_and_leave(server.url, after_s=0.05)
    assert a.get().status_code == 200
    m = metrics(server.url)
    assert m["strata_prefill_preemptions_total"] == m["strata_prefill_resumes_total"]
    assert m["strata_queue_wait_seconds_count"] == 1  # the leaver never reached the engine
    assert m["strata_parked_requests"] == 0


def test_a_queued_request_can_leave_before_its_turn(server_factory):
    server = preempt_server(server_factory)
    a = start_a(server)
    b = Background(complete_tokens, server.url, 20, 100)
    b.start()
    wait_for(lambda: status(server)["parked"] != [])
    post_and_leave(server.url, after_s=0.2)
    wait_for(lambda: status(server)["queued"] == 0)
    assert b.get().status_code == 200 and a.get().status_code == 200
    assert metrics(server.url)["strata_queue_wait_seconds_count"] == 2  # A and B only


def test_the_parked_request_can_be_cancelled_by_its_client(preempting):
    server = preempting
    with httpx.stream("POST", server.url + "/v1/completions", timeout=30,
                      json={"prompt": list(range(100, 100 + LONG)), "max_tokens": 3, "stream": True}) as r:
        assert r.status_code == 200
        wait_for(lambda: (status(server)["prompt_progress"] or {}).get("done", 0) > 0)
        b = Background(complete_tokens, server.url, 20, 100)
        b.start()
        wait_for(lambda: status(server)["parked"] != [])
    # A's client has gone while parked: its park is cancelled
    wait_for(lambda: status(server)["parked"] == [])
    assert b.get().status_code == 200
    assert metrics(server.url)["strata_parked_requests"] == 0
    assert complete_tokens(server.url, 300, 2).status_code == 200
    assert "no parked request" not in server.log()


def test_a_failing_interim_request_does_not_stop_the_resume(server_factory):
    server = preempt_server(server_factory, "--vocab", "40000")
    a = start_a(server)
    bad = httpx.post(server.url + "/v1/completions", json={"prompt": [45000, 1], "max_tokens": 2}, timeout=30)
    assert bad.status_code == 400 and "vocabulary" in bad.json()["error"]["message"]
    assert a.get().status_code == 200
    assert metrics(server.url)["strata_prefill_resumes_total"] == 1


def test_shutdown_with_one_parked_and_two_queued_answers_everyone(server_factory):
    server = preempt_server(server_factory, server_args=("--shutdown-grace-s", "0"))
    a = start_a(server)
    b = Background(complete_tokens, server.url, 20, 500)  # 5 s of decoding
    b.start()
    wait_for(lambda: status(server)["parked"] != [])
    queued = [Background(complete_tokens, server.url, 20, 5) for _ in range(2)]
    for q in queued:
        q.start()
    wait_for(lambda: status(server)["queued"] == 2)
    engines = server.engine_pids()
    server.proc.send_signal(signal.SIGINT)
    results = [t.get(timeout=20) for t in (a, b, *queued)]
    assert all(isinstance(r, httpx.Response) and r.status_code == 503 for r in results), results
    assert all("shutting down" in r.json()["error"]["message"] for r in results)
    assert server.proc.wait(20) == 0
    wait_for(lambda: not any(os.path.exists(f"/proc/{pid}") and "zombie" not in open(f"/proc/{pid}/status").read()
                             for pid in engines))


def test_max_wait_lets_the_parked_read_go_ahead_of_a_stream_of_arrivals(server_factory):
    server = preempt_server(server_factory, server_args=("--prefill-preempt-max-wait-s", "1"))
    a = Background(timed, complete_tokens, server.url, LONG, 3)
    a.start()
    wait_for(lambda: (status(server)["prompt_progress"] or {}).get("done", 0) > 0)
    stop_at = time.monotonic() + 8

    def arrivals():
        while time.monotonic() < stop_at:
            complete_tokens(server.url, 20, 20)  # 0.2 s each

    streams = [threading.Thread(target=arrivals) for _ in range(2)]  # the queue never drains
    for t in streams:
        t.start()
    ra, a_done = a.get()
    for t in streams:
        t.join()
    assert ra.status_code == 200
    assert a_done < stop_at - 1  # A did not wait for the stream to end
    m = metrics(server.url)  # parked (once, or again on a loaded machine), and every park resumed
    assert m["strata_prefill_preemptions_total"] >= 1
    assert m["strata_prefill_resumes_total"] == m["strata_prefill_preemptions_total"]


def test_preempt_off_is_strict_fifo(server_factory):
    server = server_factory(engine_cmd=mock_engine_cmd("--chunk", "64", "--chunk-s", "0.05"),
                            extra=["--no-prefill-preempt"])
    a = Background(timed, complete_tokens, server.url, LONG, 3)
    a.start()
    wait_for(lambda: (status(server)["prompt_progress"] or {}).get("done", 0) > 0)
    rb, b_done = timed(complete_tokens, server.url, 20, 2)
    ra, a_done = a.get()
    assert rb.status_code == ra.status_code == 200 and a_done < b_done
    assert metrics(server.url)["strata_prefill_preemptions_total"] == 0


def test_an_engine_without_the_preempt_capability_is_served_fifo(server_factory):
    server = preempt_server(server_factory, "--no-preempt-cap")
    a = Background(timed, complete_tokens, server.url, LONG, 3)
    a.start()
    wait_for(lambda: (status(server)["prompt_progress"] or {}).get("done", 0) > 0)
    rb, b_done = timed(complete_tokens, server.url, 20, 2)
    ra, a_done = a.get()
    assert a_done < b_done and metrics(server.url)["strata_prefill_preemptions_total"] == 0
    assert server.log().count("lacks the 'preempt' capability") == 1


# ---------------------------------------------------------------- whom a park is worth it for

def test_a_waiter_longer_than_what_the_reader_has_left_parks_nothing_until_it_has_aged(server_factory):
    """B's own read (2,600) is longer than all of A's (2,560): parking A would not shorten anyone's
    wait, so no offer is made, until B has waited --prefill-preempt-aged-s."""
    server = preempt_server(server_factory, server_args=("--prefill-preempt-aged-s", "60"))
    a = start_a(server)
    b = complete_tokens(server.url, 2600, 2)
    assert a.get().json()["timings"]["parks"] == 0 and b.json()["timings"]["parks"] == 0
    assert metrics(server.url)["strata_prefill_preemptions_total"] == 0
    aged = preempt_server(server_factory, server_args=("--prefill-preempt-aged-s", "0.3"))
    a = start_a(aged)
    b = complete_tokens(aged.url, 2600, 2)
    assert a.get().json()["timings"]["parks"] == 1  # B went next once 0.3 s old,
    assert b.json()["timings"]["queue_wait_ms"] < 1500  # not after A's whole 2 s read


def test_a_lower_class_never_preempts_and_waiters_go_by_class(server_factory):
    """priority (lower first, as vLLM's): B of class 1 waits for A of class 0 however short it is;
    among waiters C (class 0) goes before B (class 1) though B came first."""
    server = preempt_server(server_factory)
    a = start_a(server)
    b = Background(timed, complete_tokens, server.url, 20, 2, priority=1)
    b.start()
    wait_for(lambda: status(server)["queued"] == 1)
    c = Background(timed, complete_tokens, server.url, 20, 2, priority=0)
    c.start()
    (rb, b_done), (rc, c_done) = b.get(), c.get()
    assert rb.status_code == rc.status_code == 200 and c_done < b_done
    assert a.get().json()["timings"]["parks"] == 1  # C (class 0, short) parked A; B never did
    assert metrics(server.url)["strata_prefill_preemptions_total"] == 1
