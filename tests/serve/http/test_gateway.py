"""Strata behind a router: the endpoints the Shepherd Model Gateway (`smg`, installed from PyPI by the
dev set-up) and inference gateways read, and two real servers behind the real smg binary on
127.0.0.1: requests through the router answer as direct ones do, an agent's turns stay on one
server under cache_aware, and a server killed mid-stream fails only the stream it held while the
router stops sending to it. The servers run the mock engine (deterministic: its answer is a
function of the prompt; slow on demand)."""
from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import pytest

from tests.harness import ServerProcess, die_with_parent, free_port, mock_engine_cmd

SMG = shutil.which("smg") or str(Path(sys.executable).parent / "smg")
MODEL = "SmolLM2-135M-Instruct.Q4_1"


def chat(url: str, text: str, max_tokens: int = 8, **extra) -> dict:
    r = httpx.post(f"{url}/v1/chat/completions", timeout=60, json={
        "model": MODEL, "messages": [{"role": "user", "content": text}], "max_tokens": max_tokens,
        "temperature": 0, **extra})
    assert r.status_code == 200, r.text
    return r.json()


def first_token(lines) -> dict:
    """The first chunk of a chat stream that carries generated text (the role chunk comes before the
    request has gone into the engine)."""
    for line in lines:
        if line.startswith("data:") and line != "data: [DONE]":
            chunk = json.loads(line[5:])
            if chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                return chunk
    raise AssertionError("the stream ended without text")


def stream_outcome(lines) -> str:
    """How a chat stream ended: its finish_reason, or "error" for an error event (smg reports a
    worker lost mid-stream so), or "cut" when the connection itself broke."""
    try:
        for line in lines:
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[5:])
            if "error" in chunk:
                return "error"
            if chunk["choices"] and chunk["choices"][0].get("finish_reason"):
                return chunk["choices"][0]["finish_reason"]
    except httpx.HTTPError:
        return "cut"
    return "cut"


def requests_served(server: ServerProcess) -> int:
    """Chat requests the server finished (its strata_requests counter)."""
    total = 0.0
    for line in httpx.get(f"{server.url}/metrics", timeout=10).text.splitlines():
        if line.startswith("strata_requests_total"):
            total += float(line.rsplit(" ", 1)[1])
    return int(total)


@contextlib.contextmanager
def router(*workers: ServerProcess, policy: str = "cache_aware"):
    port = free_port()
    cmd = [SMG, "launch", "--host", "127.0.0.1", "--port", str(port), "--policy", policy,
           "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port()),  # not the shared default
           "--worker-urls", *(w.url for w in workers), "--load-monitor-interval", "1",
           "--health-check-interval-secs", "1", "--health-failure-threshold", "1", "--log-level", "warn"]
    log = tempfile.NamedTemporaryFile(prefix="smg-", suffix=".log", delete=False)
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                            preexec_fn=die_with_parent)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:  # the router answers once it has registered the workers
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"{url}/v1/models", timeout=2).json().get("data"):
                    break
            assert proc.poll() is None and time.monotonic() < deadline, (
                f"smg did not register the workers:\n{Path(log.name).read_text(errors='replace')[-3000:]}")
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        Path(log.name).unlink()


@pytest.fixture(scope="module")
def pair():
    a = ServerProcess(engine_cmd=mock_engine_cmd("--token-s", "0.01")).start()
    b = ServerProcess(engine_cmd=mock_engine_cmd("--token-s", "0.01")).start()
    try:
        yield a, b
    finally:
        a.stop()
        b.stop()


def test_the_registration_probes_answer(pair):
    server = pair[0]
    assert httpx.get(f"{server.url}/version").json()["version"]
    models = httpx.get(f"{server.url}/v1/models").json()["data"]
    assert models[0]["id"] == MODEL and models[0]["owned_by"] == "strata"
    for path in ("/server_info", "/get_server_info", "/model_info", "/get_model_info"):
        info = httpx.get(server.url + path).json()
        assert info["served_model_name"] == MODEL and info["is_generation"] is True, path
    assert httpx.get(f"{server.url}/server_info").json()["dp_size"] == 1


LONG_ANSWERS = mock_engine_cmd("--token-s", "0.02", "--script", "28,29,30")  # no end of turn: max_tokens ends it


def test_the_load_report_matches_status_while_a_request_runs():
    with ServerProcess(engine_cmd=LONG_ANSWERS) as server, httpx.Client(timeout=60) as client, client.stream(
            "POST", f"{server.url}/v1/chat/completions",
            json={"model": MODEL, "messages": [{"role": "user", "content": "count"}], "max_tokens": 300,
                  "stream": True}) as stream:
        lines = stream.iter_lines()  # kept while the request runs: a dropped one closes the stream
        first_token(lines)  # decoding now
        while True:  # the engine's pool reports come as it steps: a report between the calls is read again
            before = client.get(f"{server.url}/status").json()
            loads = client.get(f"{server.url}/v1/loads", params={"include": "core"}).json()
            metrics = client.get(f"{server.url}/metrics").text
            status = client.get(f"{server.url}/status").json()
            if status["kv"] == before["kv"]:
                break
    (rank,) = loads["loads"]
    kv = status["kv"]
    assert rank["dp_rank"] == 0 and loads["dp_rank_count"] == 1
    assert rank["num_running_reqs"] == len(status["running"]) == 1
    assert rank["num_waiting_reqs"] == status["queued"] + status["parked_requests"] == 0
    assert rank["max_total_num_tokens"] == kv["kv_blocks"] * kv["kv_block"] > 0
    assert rank["num_used_tokens"] == kv["used"] * kv["kv_block"] > 0
    assert rank["token_usage"] == pytest.approx(kv["used"] / kv["kv_blocks"], abs=1e-4)
    assert "vllm:num_requests_running 1.0" in metrics and "vllm:num_requests_waiting 0.0" in metrics
    usage = float(next(line.split()[1] for line in metrics.splitlines() if line.startswith("vllm:kv_cache_usage_perc")))
    assert usage == pytest.approx(kv["used"] / kv["kv_blocks"], abs=1e-4)


def test_through_the_router_answers_equal_direct_ones(pair):
    with router(*pair) as url:
        for text in ("What is the capital of France?", "Write a haiku about routers.", "2 + 2 ="):
            routed, direct = chat(url, text), chat(pair[1].url, text)
            assert routed["choices"][0]["message"] == direct["choices"][0]["message"]
            assert routed["usage"]["completion_tokens"] == direct["usage"]["completion_tokens"]


def test_an_agents_turns_stay_on_one_server_under_cache_aware(pair):
    system = "You are a careful coding agent. " * 40  # the prefix every turn shares
    before = [requests_served(s) for s in pair]
    with router(*pair) as url:
        for turn in range(6):
            r = httpx.post(f"{url}/v1/chat/completions", timeout=60, json={
                "model": MODEL, "max_tokens": 4, "temperature": 0,
                "messages": [{"role": "system", "content": system}, {"role": "user", "content": f"step {turn}"}]})
            assert r.status_code == 200, r.text
    served = [requests_served(s) - b for s, b in zip(pair, before)]
    assert sorted(served) == [0, 6], served


def test_a_server_killed_mid_stream_fails_only_its_stream_and_the_router_stops_sending_to_it():
    a, b = ServerProcess(engine_cmd=LONG_ANSWERS).start(), ServerProcess(engine_cmd=LONG_ANSWERS).start()
    try:
        with router(a, b, policy="round_robin") as url, httpx.Client(timeout=60) as client:
            body = {"model": MODEL, "messages": [{"role": "user", "content": "a long answer"}], "max_tokens": 120,
                    "stream": True}
            before = requests_served(b)  # (the router may have sent a probe of its own)
            with client.stream("POST", f"{url}/v1/chat/completions", json=body) as one, \
                    client.stream("POST", f"{url}/v1/chat/completions", json=body) as two:
                lines = [stream.iter_lines() for stream in (one, two)]  # kept: a dropped one closes its stream
                for it in lines:
                    first_token(it)
                running = [len(httpx.get(f"{s.url}/status").json()["running"]) for s in (a, b)]
                assert running == [1, 1]  # round robin: one stream on each
                a.proc.kill()  # the server only: its engine goes when its pipe closes
                outcomes = [stream_outcome(it) for it in lines]
            # the dead server's stream ends in the router's error event; the other one runs to its end
            assert sorted(outcomes) == ["error", "length"], outcomes
            for turn in range(4):  # the router stops sending to the dead one (a retry may hide the first)
                assert chat(url, f"after {turn}")["choices"][0]["message"]["content"]
            assert requests_served(b) - before >= 5  # its stream and the four after
    finally:
        a.stop()
        b.stop()
