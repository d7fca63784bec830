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
