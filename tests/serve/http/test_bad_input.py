"""Bad input gets a 4xx in OpenAI's error shape, nothing crashes, and the next request works."""
import re

import httpx
import openai
import pytest

from tests.harness import mock_engine_cmd
from tests.serve.helpers import chat


def assert_openai_error(r: httpx.Response, status: int, fragment: str) -> None:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["type"] == "invalid_request_error"
    assert fragment in err["message"], err["message"]


@pytest.mark.parametrize("body, fragment", [
    ({"messages": []}, "at least 1 item"),
    ({}, "messages: Field required"),
    ({"messages": "hello"}, "messages"),
    ({"messages": [{"role": "user", "content": 5}]}, "content"),
    ({"messages": [{"role": "wizard", "content": "hi"}]}, "role"),
    ({"messages": [{"role": "user", "content": ""}]}, "every message is empty"),
    ({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 0}, "max_tokens must be >= 1"),
    ({"messages": [{"role": "user", "content": "hi"}], "max_tokens": -3}, "max_tokens must be >= 1"),
    ({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 10**9}, "exceeds the context"),
    ({"messages": [{"role": "user", "content": "hi"}], "max_tokens": "many"}, "max_tokens"),
    ({"messages": [{"role": "user", "content": "hi"}], "temperature": 5}, "temperature"),
    ({"messages": [{"role": "user", "content": "hi"}], "top_p": 0}, "top_p"),
    ({"messages": [{"role": "user", "content": "hi"}], "n": 17}, "n"),
    ({"messages": [{"role": "user", "content": "hi"}], "stop": ["a", "b", "c", "d", "e"]}, "at most 4"),
])
def test_bad_chat_bodies_are_400_with_openai_shape(mock_server, body, fragment):
    r = httpx.post(mock_server.url + "/v1/chat/completions", json=body)
    assert_openai_error(r, 400, fragment)
    assert chat(mock_server.url, max_tokens=2).status_code == 200


def test_malformed_json_is_400(mock_server):
    r = httpx.post(mock_server.url + "/v1/chat/completions", content=b'{"messages": [',
                   headers={"content-type": "application/json"})
    assert_openai_error(r, 400, "malformed JSON")
    assert chat(mock_server.url, max_tokens=2).status_code == 200


def test_bad_completion_prompts(mock_server):
    url = mock_server.url + "/v1/completions"
    assert_openai_error(httpx.post(url, json={"prompt": []}), 400, "must not be empty")
    assert_openai_error(httpx.post(url, json={"prompt": ""}), 400, "prompt is empty")
    assert_openai_error(httpx.post(url, json={"prompt": [1, 10**7]}), 400, "within the vocabulary")
    assert_openai_error(httpx.post(url, json={"prompt": ["a", "b"]}), 400, "one prompt")


def test_prompt_longer_than_the_context_is_refused(server_factory):
    server = server_factory(engine_cmd=mock_engine_cmd("--ctx", "64"))
    r = chat(server.url, "word " * 100)
    assert_openai_error(r, 400, "the context holds 64")
    assert re.match(r"prompt is too long: \d+ tokens > 63 maximum", r.json()["error"]["message"])
    assert r.json()["error"]["code"] == "context_length_exceeded"
    assert chat(server.url, "hi", max_tokens=2).status_code == 200


def test_api_key_is_required_on_v1_when_set(server_factory):
    server = server_factory(engine_cmd=mock_engine_cmd(), api_key="sekrit")
    r = chat(server.url)
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    wrong = openai.OpenAI(base_url=server.url + "/v1", api_key="nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        wrong.models.list()
    right = openai.OpenAI(base_url=server.url + "/v1", api_key="sekrit", max_retries=0)
    assert right.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}],
                                         max_tokens=2).choices[0].message.content is not None
    assert httpx.get(server.url + "/health").status_code == 200  # ops endpoints stay open


def test_a_full_queue_refuses_at_once_429_for_openai_and_529_for_anthropic(server_factory):
    """--max-queue 1 over an engine that runs one request at a time: one runs, one waits, the next
    is refused at once (with Retry-After; Anthropic's overloaded_error, which its clients retry),
    and once the queue drains a request is served again."""
    import threading

    from tests.serve.scheduling.test_scheduling import status, wait_for

    # each request holds the engine 2 s: the refusals are asked for within it on a busy machine too
    server = server_factory(engine_cmd=mock_engine_cmd("--max-running", "1", "--chunk-s", "2"),
                            extra=["--max-queue", "1"])
    answers = []
    first = threading.Thread(target=lambda: answers.append(chat(server.url, "one", max_tokens=2).status_code))
    first.start()
    wait_for(lambda: len(status(server)["running"]) == 1)
    second = threading.Thread(target=lambda: answers.append(chat(server.url, "two", max_tokens=2).status_code))
    second.start()
    wait_for(lambda: status(server)["queued"] == 1)
    r = chat(server.url, "three", max_tokens=2)
    assert r.status_code == 429 and r.headers["retry-after"] == "1"
    err = r.json()["error"]
    assert (err["type"], err["code"]) == ("rate_limit_error", "rate_limit_exceeded") and "overloaded" in err["message"]
    r = httpx.post(server.url + "/v1/messages", json={"model": "any", "max_tokens": 2,
                                                       "messages": [{"role": "user", "content": "three"}]})
    assert r.status_code == 529 and r.json()["error"]["type"] == "overloaded_error"
    first.join(60)
    second.join(60)
    assert answers == [200, 200]
    assert chat(server.url, "four", max_tokens=2).status_code == 200
