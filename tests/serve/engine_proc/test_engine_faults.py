"""Engine faults seen from the HTTP side: malformed lines, slow or failed start-up (deaths: test_engine_recovery)."""
import httpx

from tests.harness import mock_engine_cmd
from tests.serve.helpers import Background, complete_tokens
from tests.serve.scheduling.test_scheduling import wait_for


def test_malformed_engine_line_fails_the_request_with_502_and_serving_goes_on(server_factory):
    server = server_factory(engine_cmd=mock_engine_cmd("--malformed-at-chunk", "2"))
    r = complete_tokens(server.url, 500, 2)
    assert r.status_code == 502 and "malformed line" in r.json()["error"]["message"]
    assert complete_tokens(server.url, 10, 2).status_code == 200
    assert "malformed engine line" in server.log()


def test_health_is_503_while_the_engine_starts(server_factory):
    # a start slow enough that a busy machine (make test's parallel workers) still asks within it
    server = server_factory(engine_cmd=mock_engine_cmd("--start-delay", "4"), wait_ready=False)
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


def test_an_engine_that_refuses_its_options_is_not_restarted_and_says_why(server_factory):
    """The real engine asked for a request longer than its KV pool (--ctx 4096 beside --kv-tokens 1024) refuses
    at start-up: one attempt, not the restarts' four, and /health and the requests carry its reason."""
    server = server_factory(extra=["--ctx", "4096", "--kv-tokens", "1024", "--max-restarts", "3"], wait_ready=False)
    wait_for(lambda: httpx.get(server.url + "/health").json()["status"] == "failed", timeout_s=60)
    health = httpx.get(server.url + "/health")
    assert health.status_code == 503 and "--ctx 4096 is larger than the KV pool" in health.json()["error"]
    r = complete_tokens(server.url, 10, 2)
    assert r.status_code == 503 and "--ctx 4096 is larger than the KV pool" in r.json()["error"]["message"]
    log = server.log()
    assert "engine refused to start" in log and "start failed (attempt" not in log
    assert log.count("strata: error: --ctx 4096") == 1  # one engine started
