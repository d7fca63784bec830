"""Engine faults seen from the HTTP side: death, malformed lines, slow or failed start-up."""
import os
import signal

import httpx

from tests.harness import mock_engine_cmd
from tests.serve.helpers import Background, complete_tokens, metrics
from tests.serve.test_scheduling import status, wait_for


def test_engine_killed_mid_request_fails_it_clearly_then_recovers(server_factory):
    server = server_factory(engine_cmd=mock_engine_cmd("--chunk-s", "0.05"))
    victim = Background(complete_tokens, server.url, 3000, 2)
    victim.start()
    wait_for(lambda: status(server)["busy"])
    for pid in server.engine_pids():
        os.kill(pid, signal.SIGKILL)
    r = victim.get()
    assert r.status_code == 503
    assert "engine process exited unexpectedly" in r.json()["error"]["message"]
    assert r.json()["error"]["type"] == "server_error"
    server.wait_healthy()
    assert complete_tokens(server.url, 10, 2).status_code == 200
    assert metrics(server.url)["strata_engine_restarts_total"] == 1


def test_engine_death_mid_stream_sends_an_error_event(server_factory):
    server = server_factory(engine_cmd=mock_engine_cmd("--chunk-s", "0.02", "--die-at-chunk", "5"))
    with httpx.stream("POST", server.url + "/v1/completions", timeout=30,
                      json={"prompt": list(range(100, 1000)), "max_tokens": 3, "stream": True}) as r:
        body = "".join(r.iter_text())
    assert '"error"' in body and "exited unexpectedly" in body
    server.wait_healthy()
    assert complete_tokens(server.url, 10, 2).status_code == 200


def test_malformed_engine_line_fails_the_request_with_502_and_serving_goes_on(server_factory):
    server = server_factory(engine_cmd=mock_engine_cmd("--malformed-at-chunk", "2"))
    r = complete_tokens(server.url, 500, 2)
    assert r.status_code == 502 and "malformed line" in r.json()["error"]["message"]
    assert complete_tokens(server.url, 10, 2).status_code == 200
    assert "malformed engine line" in server.log()


def test_health_is_503_while_the_engine_starts(server_factory):
    server = server_factory(engine_cmd=mock_engine_cmd("--start-delay", "2"), wait_ready=False)
    r = httpx.get(server.url + "/health")
    assert r.status_code == 503 and r.json()["status"] == "starting"
    queued = Background(complete_tokens, server.url, 10, 2)  # waits for the engine, then runs
    queued.start()
    server.wait_healthy()
    assert queued.get().status_code == 200


def test_an_engine_that_cannot_start_gives_clear_errors(server_factory):
    server = server_factory(engine_cmd="false", extra=["--max-restarts", "1"], wait_ready=False)
    wait_for(lambda: httpx.get(server.url + "/health").json()["status"] == "failed", timeout_s=15)
    r = complete_tokens(server.url, 10, 2)
    assert r.status_code == 503 and "engine is unavailable" in r.json()["error"]["message"]
