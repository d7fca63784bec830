"""GET /v1/events, the live state stream (serve/http/events_api.py), against the real server over the mock
engine: the messages' schema, their rate, a parked read visible while a short request runs, a
client leaving frees its stream, and the endpoint behind the same Host and API-key checks as the
API, with no cross-origin access."""
from __future__ import annotations

import concurrent.futures as cf
import time

import httpx

from tests.harness import ServerProcess, mock_engine_cmd
from tests.serve.helpers import state_events
from tests.serve.scheduling.test_scheduling import status, wait_for

REQUEST_KEYS = {"id", "engine", "state", "prompt_tokens", "done", "generated", "priority", "parks", "in_host", "age_s"}


def test_schema_rate_and_a_parked_read_while_a_short_request_runs():
    engine = mock_engine_cmd("--chunk-s", "0.05", "--token-s", "0.01")
    with ServerProcess(engine_cmd=engine) as server, cf.ThreadPoolExecutor(3) as pool:
        def chat(text: str, n: int):
            return httpx.post(f"{server.url}/v1/chat/completions", timeout=60, json={
                "model": "m", "messages": [{"role": "user", "content": text}], "max_tokens": n}).json()

        watched = pool.submit(state_events, server.url, 3.0, 5)
        wait_for(lambda: status(server)["event_streams"] == 1)
        long = pool.submit(chat, "read " * 3000, 4)  # ~47 chunks of 64: about 2.4 s of reading
        wait_for(lambda: (status(server)["prompt_progress"] or {}).get("done", 0) > 0)
        short = chat("a short question", 40)  # ~0.4 s of decoding: longer than two messages apart
        assert short["timings"]["queue_wait_ms"] < 1000
        assert long.result()["timings"]["parks"] >= 1
        seen = watched.result()
    stamps = [at for at, _ in seen]
    # 5 a second for 3 s: on a loaded machine (the suite's other worker reading a 0.5B model) a message
    # may come late and the next one early, never at another rate
    assert 10 <= len(seen) <= 18
    assert all(0.05 <= b - a <= 0.6 for a, b in zip(stamps[1:], stamps[2:]))
    for _, msg in seen:
        assert set(msg) == {"t", "engines", "requests", "kv", "rates", "totals", "waiting_for_memory"}
        assert msg["engines"][0]["state"] == "ready" and msg["kv"]["kv_blocks"] > 0
        assert all(set(r) == REQUEST_KEYS for r in msg["requests"])
    states = [{r["state"] for r in msg["requests"]} for _, msg in seen]
    assert any({"parked", "decoding"} <= s or {"parked", "reading"} <= s for s in states)  # the short one ran
    reading = [r for _, msg in seen for r in msg["requests"] if r["state"] == "reading"]
    assert any(0 < r["done"] < r["prompt_tokens"] for r in reading)  # prompt progress
    assert seen[-1][1]["totals"]["parks"] >= 1 and max(msg["rates"]["prompt_tok_s"] for _, msg in seen) > 0


def test_a_client_leaving_frees_its_stream_and_bad_rates_are_refused():
    with ServerProcess(engine_cmd=mock_engine_cmd()) as server:
        assert len(state_events(server.url, 1.5, hz=10)) >= 4  # the window's slack for a busy machine
        deadline = time.monotonic() + 5
        while httpx.get(f"{server.url}/status").json()["event_streams"]:
            assert time.monotonic() < deadline, "the stream outlived its client"
            time.sleep(0.05)
        r = httpx.get(f"{server.url}/v1/events", params={"hz": 100})
        assert r.status_code == 400 and r.json()["error"]["param"] == "hz"


def test_the_host_check_the_api_key_and_no_cross_origin_access():
    with ServerProcess(engine_cmd=mock_engine_cmd(), api_key="k") as server:
        url = f"{server.url}/v1/events"
        assert httpx.get(url, headers={"Host": "evil.example"}).status_code == 403  # DNS rebinding
        assert httpx.get(url).status_code == 401
        assert len(state_events(server.url, 0.3, headers={"Authorization": "Bearer k"})) >= 1
        preflight = httpx.options(url, headers={"Origin": "https://evil.example",
                                                "Access-Control-Request-Method": "GET"})
        assert preflight.status_code == 403 and "access-control-allow-origin" not in preflight.headers
