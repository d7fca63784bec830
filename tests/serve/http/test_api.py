"""The OpenAI-compatible API over the mock engine, through the real openai client."""
import concurrent.futures
import threading
import time

import httpx
import openai
import pytest

from tests.serve.helpers import chat, metrics


@pytest.fixture(scope="module")
def client(mock_server):
    return openai.OpenAI(base_url=mock_server.url + "/v1", api_key="unused", max_retries=0)


def test_chat_non_stream_with_openai_client(client):
    r = client.chat.completions.create(model="any", messages=[{"role": "user", "content": "Hi"}], max_tokens=12)
    choice = r.choices[0]
    assert choice.message.role == "assistant" and choice.message.content
    assert choice.finish_reason == "length"
    assert r.usage.completion_tokens == 12 and r.usage.prompt_tokens > 12
    assert r.usage.total_tokens == r.usage.prompt_tokens + 12


def test_stream_text_equals_non_stream_text(client):
    args = dict(model="any", messages=[{"role": "user", "content": "Say something"}], max_tokens=20, seed=5)
    whole = client.chat.completions.create(**args)
    chunks = list(client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **args))
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == whole.choices[0].message.content and streamed
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == whole.choices[0].finish_reason
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_completions_stream_and_non_stream(client):
    whole = client.completions.create(model="any", prompt="Once upon a time", max_tokens=6)
    assert whole.choices[0].text == "Once upon a timeOnce upon"  # the mock echoes the prompt, cycled
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model="any", prompt="Once upon a time", max_tokens=6, stream=True))
    assert streamed == whole.choices[0].text


def test_stop_string_cuts_the_text_and_reports_stop(client):
    # the mock echoes the prompt, so the completion is the prompt's text
    r = client.completions.create(model="any", prompt="alpha beta gamma delta", max_tokens=20, stop=[" gamma"])
    assert r.choices[0].text == "alpha beta" and r.choices[0].finish_reason == "stop"


def test_models_lists_the_model(client):
    ids = [m.id for m in client.models.list().data]
    assert ids == ["SmolLM2-135M-Instruct.Q4_1"]


def test_health_status_and_metrics(mock_server):
    assert httpx.get(mock_server.url + "/health").json() == {"status": "ok"}
    status = httpx.get(mock_server.url + "/status").json()
    assert status["busy"] is False and status["queued"] == 0 and status["phase"] == "idle"
    before = metrics(mock_server.url)
    chat(mock_server.url, max_tokens=3)
    after = metrics(mock_server.url)
    assert after["strata_requests_total{finish_reason=length}"] == \
        before.get("strata_requests_total{finish_reason=length}", 0) + 1
    assert after["strata_generated_tokens_total"] == before["strata_generated_tokens_total"] + 3
    assert after["strata_queue_wait_seconds_count"] == before["strata_queue_wait_seconds_count"] + 1
    assert after["strata_ttft_seconds_count"] == before["strata_ttft_seconds_count"] + 1
    assert after["strata_prompt_tokens_total"] > before["strata_prompt_tokens_total"]
    assert after["strata_max_queue_wait_ms"] > 0


def test_twenty_concurrent_clients_are_all_answered(mock_server):
    with concurrent.futures.ThreadPoolExecutor(20) as pool:
        results = list(pool.map(lambda i: chat(mock_server.url, f"client {i}", max_tokens=5), range(20)))
    assert [r.status_code for r in results] == [200] * 20
    assert all(r.json()["usage"]["completion_tokens"] == 5 for r in results)


def test_sse_keepalive_comments_while_queued(mock_server):
    blocker = threading.Thread(target=lambda: httpx.post(
        mock_server.url + "/v1/completions", json={"prompt": list(range(100, 110)), "max_tokens": 600}, timeout=60))  # decoding: never parks
    blocker.start()
    deadline = time.monotonic() + 10
    while not httpx.get(mock_server.url + "/status").json()["busy"] and time.monotonic() < deadline:
        time.sleep(0.01)
    with httpx.stream("POST", mock_server.url + "/v1/completions", timeout=60,
                      json={"prompt": "hi", "max_tokens": 2, "stream": True}) as r:
        body = "".join(r.iter_text())
    blocker.join()
    assert ": keep-alive" in body and body.rstrip().endswith("data: [DONE]")


def test_timings_say_when_the_first_text_went_out_and_which_token_completed_it(mock_server):
    """The mock echoes the prompt: an emoji's four bytes come as byte tokens, the first three holding no text."""
    plain = httpx.post(mock_server.url + "/v1/completions", json={"prompt": "Once", "max_tokens": 3}, timeout=60).json()
    emoji = httpx.post(mock_server.url + "/v1/completions", json={"prompt": "\U0001F600 hi", "max_tokens": 6},
                       timeout=60).json()
    assert plain["timings"]["first_text_token"] == 1
    assert emoji["choices"][0]["text"].startswith("\U0001F600")
    t = emoji["timings"]
    assert t["first_text_token"] > 1 and t["first_text_ms"] >= t["ttft_ms"]


def test_waits_count_from_the_http_requests_arrival(mock_server):
    """intake_ms: the server's time from the request's arrival (its headers read) to its place in line (the body
    parsed, the template and the tokenizer run), within the queue wait and the time to first token."""
    words = " ".join(["word"] * 6000)  # (the mock's context: 8,192 tokens)
    r = httpx.post(mock_server.url + "/v1/chat/completions", timeout=120,
                   json={"messages": [{"role": "user", "content": words}], "max_tokens": 2}).json()
    t = r["timings"]
    assert 0 < t["intake_ms"] <= t["queue_wait_ms"] <= t["ttft_ms"]
    assert metrics(mock_server.url)["strata_intake_seconds_count"] >= 1
