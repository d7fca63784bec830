"""Engine death loses no request (mock engine faults): reads run again, decodes continue from the
tokens already sent, a stream shows each token once, and a poison request fails alone."""
import os
import signal
import subprocess

import httpx
import pytest

from tests.harness import PY, ROOT, mock_engine_cmd
from tests.serve.helpers import Background, metrics, sse_chunks
from tests.serve.scheduling.test_scheduling import status, wait_for

PROMPT = list(range(300, 300 + 700))  # 11 chunks of 64; the mock echoes it back


def fault_server(server_factory, tmp_path, *faults, server_args=()):
    cmd = mock_engine_cmd("--chunk", "64", "--chunk-s", "0.02", "--token-s", "0.01",
                          "--faults-once", str(tmp_path / "fired"), *faults)
    return server_factory(engine_cmd=cmd, extra=list(server_args))


def complete(server, max_tokens: int = 12, prompt=PROMPT) -> httpx.Response:
    return httpx.post(server.url + "/v1/completions", json={"prompt": prompt, "max_tokens": max_tokens}, timeout=60)


def stream(server, max_tokens: int = 12, prompt=PROMPT) -> tuple[list[str], dict]:
    """Every text piece the client saw, and the final chunk (finish reason, timings, usage)."""
    pieces, last, usage = [], {}, None
    body = {"prompt": prompt, "max_tokens": max_tokens, "stream_options": {"include_usage": True}}
    for chunk in sse_chunks(server.url, "/v1/completions", body, timeout=60):
        usage = chunk.get("usage") or usage
        for choice in chunk["choices"]:
            pieces += [choice["text"]] if choice["text"] else []
            last = chunk if choice["finish_reason"] else last
    return pieces, last | {"usage": usage}


def concurrently(server, max_tokens: int, prompts: list) -> list[httpx.Response]:
    """The prompts' completions sent at once, each answered 200."""
    clients = [Background(complete, server, max_tokens, p) for p in prompts]
    for c in clients:
        c.start()
    answers = [c.get() for c in clients]
    assert all(r.status_code == 200 for r in answers), [r.text for r in answers]
    return answers


def recovered(server) -> float:
    return metrics(server.url).get('strata_engine_death_requests_total{outcome=recovered}', 0)


@pytest.mark.parametrize("fault", [("--die-at-chunk", "4"), ("--die-at-gen", "1"), ("--die-after-tokens", "5")],
                         ids=["while-reading", "gen-unread", "while-decoding"])
def test_a_request_in_the_engine_when_it_dies_gets_its_complete_answer(server_factory, tmp_path, fault):
    server = fault_server(server_factory, tmp_path, *fault)
    r = complete(server)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["choices"][0]["text"] == complete(server).json()["choices"][0]["text"]  # same, no fault
    assert body["usage"] == {"prompt_tokens": 700, "completion_tokens": 12, "total_tokens": 712,
                             "prompt_tokens_details": {"cached_tokens": 0}}  # read on a fresh engine
    assert body["timings"]["engine_restarts"] == 1
    m = metrics(server.url)
    assert m["strata_engine_restarts_total"] == 1 and recovered(server) == 1
    assert m["strata_prompt_tokens_total"] == 2 * 700  # the re-read is not counted twice


def test_a_stream_cut_while_decoding_shows_each_token_once(server_factory, tmp_path):
    server = fault_server(server_factory, tmp_path, "--die-after-tokens", "6")
    pieces, last = stream(server, max_tokens=16)
    reference, _ = stream(server, max_tokens=16)
    assert pieces == reference and len(pieces) == 16
    assert last["choices"][0]["finish_reason"] == "length" and last["timings"]["engine_restarts"] == 1
    assert last["usage"]["completion_tokens"] == 16


def test_a_parked_read_and_the_request_decoding_beside_it_both_survive(server_factory, tmp_path):
    # A reads cold again, 2 s of it (chunks of 0.05 s): B comes while it reads on a busy machine too
    server = fault_server(server_factory, tmp_path, "--die-while-parked", "--no-prompt-reuse", "--chunk-s", "0.05")
    long_prompt = list(range(100, 100 + 2560))
    alone = [complete(server, 3, long_prompt).json()["choices"][0]["text"], complete(server, 200).json()]
    a = Background(complete, server, 3, long_prompt)
    a.start()
    wait_for(lambda: (status(server)["prompt_progress"] or {}).get("done", 0) > 0)
    b = Background(complete, server, 200)  # parks A; the engine dies 0.2 s later, B decoding
    b.start()
    ra, rb = a.get(), b.get()
    assert ra.status_code == rb.status_code == 200, (ra.text, rb.text)
    assert ra.json()["choices"][0]["text"] == alone[0]
    assert rb.json()["choices"][0]["text"] == alone[1]["choices"][0]["text"]
    assert ra.json()["timings"]["engine_restarts"] == rb.json()["timings"]["engine_restarts"] == 1
    assert metrics(server.url)["strata_engine_restarts_total"] == 1 and recovered(server) == 2
    assert "no parked request" not in server.log()  # nothing about A's park reached the new engine


def test_an_engine_killed_while_idle_costs_the_next_request_nothing(server_factory, tmp_path):
    server = fault_server(server_factory, tmp_path)
    for pid in server.engine_pids():
        os.kill(pid, signal.SIGKILL)
    r = complete(server)  # may reach the dead engine before the server notices
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 12
    wait_for(lambda: metrics(server.url)["strata_engine_restarts_total"] == 1)


def test_a_poison_request_fails_after_the_retries_and_the_next_one_is_answered(server_factory, tmp_path):
    server = fault_server(server_factory, tmp_path, "--poison-token", "7")
    poison = complete(server, prompt=[5, 6, 7, 8])
    assert poison.status_code == 503
    message = poison.json()["error"]["message"]
    assert "exited unexpectedly" in message and "2 engine deaths" in message and "not retried" in message
    assert complete(server).status_code == 200
    m = metrics(server.url)
    assert m["strata_engine_restarts_total"] == 2
    assert m['strata_engine_death_requests_total{outcome=failed}'] == 1


def test_max_request_retries_sets_how_many_deaths_a_request_may_be_present_at(server_factory, tmp_path):
    server = fault_server(server_factory, tmp_path, "--poison-token", "7", server_args=("--max-request-retries", "3"))
    assert complete(server, prompt=[7]).status_code == 503
    assert metrics(server.url)["strata_engine_restarts_total"] == 3


def test_waiting_requests_keep_their_order_behind_the_recovered_one(server_factory, tmp_path):
    server = fault_server(server_factory, tmp_path, "--die-at-chunk", "6", server_args=("--no-prefill-preempt",))
    finished = []

    def run(i):
        r = complete(server, 4)
        finished.append(i)
        return r

    threads = [Background(run, i) for i in range(3)]
    for i, t in enumerate(threads):
        t.start()
        wait_for(lambda n=i + 1: status(server)["queued"] + status(server)["busy"] + len(finished) == n)
    assert [t.get().status_code for t in threads] == [200] * 3
    assert finished == [0, 1, 2]


def test_max_request_retries_below_one_is_refused_at_start():
    done = subprocess.run([PY, "-m", "serve", "--max-request-retries", "0"], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2 and "--max-request-retries must be >= 1" in done.stderr


def test_requests_decoding_together_in_slots_all_survive_a_death(server_factory, tmp_path):
    """Three requests decode as one batch in three slots when the engine dies: all three go back to
    the queue, continue on the restarted engine from the tokens they had, and answer in full."""
    server = fault_server(server_factory, tmp_path, "--slots", "3", "--die-after-tokens", "20")
    prompts = [list(range(1000 + 100 * i, 1000 + 100 * i + 70)) for i in range(3)]
    answers = concurrently(server, 16, prompts)
    assert metrics(server.url)["strata_engine_restarts_total"] == 1
    assert sum(r.json()["timings"]["engine_restarts"] for r in answers) >= 2  # the batch was hit
    solo = [complete(server, 16, p).json()["choices"][0]["text"] for p in prompts]  # the fault fired once
    assert [r.json()["choices"][0]["text"] for r in answers] == solo


def test_an_engine_out_of_memory_is_started_again_with_fewer_requests_and_nothing_is_lost(server_factory):
    """The engine's decode step runs out of memory at 4 rows (the mock's stand-in for a GPU memory plan that fell
    short): it says how many requests were in it (6) and exits; the server starts it again with 3/4 of them (4),
    which still runs out, then with 3, which does not, its KV pool kept as it was each time. Every request gets the answer it gets alone. (Before, an
    engine that ran out was started again as it was, and ran out again at the same load: 8 times in 3 minutes.)"""
    server = server_factory(engine_cmd=mock_engine_cmd("--chunk", "64", "--chunk-s", "0.02", "--token-s", "0.01",
                                                       "--max-running", "8", "--oom-at-running", "4"))
    prompts = [list(range(300 + 10 * i, 300 + 10 * i + 100)) for i in range(6)]
    answers = concurrently(server, 24, prompts)
    for prompt, r in zip(prompts, answers):  # the mock echoes the prompt: the answer it gives alone
        assert r.json()["choices"][0]["text"] == complete(server, 24, prompt).json()["choices"][0]["text"]
    kv = status(server)["kv"]
    log, pool = server.log(), kv["kv_blocks"] * kv["kv_block"]
    # (the KV pool kept at the size that ran out: what fewer requests leave is room, not a larger pool)
    assert (f"ran out of memory with 6 requests in it; starting it again with --max-running 4 and its KV pool as it "
            f"was (--kv-tokens {pool})") in log
    assert "ran out of memory with 4 requests in it; starting it again with --max-running 3 and its KV pool" in log
    assert f"a mock's pool of {kv['kv_blocks']} blocks); ending" in log  # (where the memory was: a GPU's figures)
    assert log.count("starting it again") == 2 and status(server)["max_running"] == 3
