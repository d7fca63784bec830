"""The pieces behind issue 42's limits: --max-body-mb's size and its 413 in both error shapes, the
bound that refuses a prompt before tokenizing it, and the encoding that lets go of the GIL."""
from __future__ import annotations

import threading
import time

import httpx
import pytest

from serve.http.body_limit import body_limit_bytes
from serve.cli import build_parser, settings_from_args
from serve.api.prompt_fit import PromptFit
from tests.harness import ServerProcess, mock_engine_cmd

MIB = 1 << 20


def test_the_default_body_limit_is_sized_from_the_context_with_a_4_mib_floor():
    assert body_limit_bytes(None, 8192) == 4 * MIB  # 8192 x 16 bytes is under the floor
    assert body_limit_bytes(None, 1 << 20) == 16 * MIB  # a 1M-token context
    assert body_limit_bytes(1.5, 1 << 20) == 3 * MIB // 2  # given: that, whatever the context
    assert body_limit_bytes(0, 8192) is None and body_limit_bytes(-1, 8192) is None  # no limit


def test_the_flag_reaches_the_settings_and_a_non_number_is_refused():
    assert settings_from_args(build_parser().parse_args(["--max-body-mb", "8"])).max_body_mb == 8.0
    assert settings_from_args(build_parser().parse_args([])).max_body_mb is None
    with pytest.raises(ValueError, match="--max-body-mb must be a number"):
        settings_from_args(build_parser().parse_args(["--max-body-mb", "nan"]))


def test_encoding_leaves_other_threads_running(tokenizer):
    """A thread counting while another encodes 600 KB: it keeps counting (`tokenizers`' one-text
    encode holds the GIL throughout, and the counter stands still; engine/modelfile/tokenizer.py's does not)."""
    text = "The quick brown fox jumps over the lazy dog. " * 13000
    counted = []
    for encode in (lambda t: tokenizer.tk.encode(t, add_special_tokens=False), tokenizer.encode):
        done, count = threading.Event(), [0]

        def spin():
            while not done.is_set():
                count[0] += 1

        worker = threading.Thread(target=lambda: (encode(text), done.set()))
        started = time.perf_counter()
        worker.start()
        spin()
        worker.join()
        counted.append(count[0] / (time.perf_counter() - started))
    assert counted[1] > 5 * counted[0], counted  # counts a second while encoding: with the GIL held, without


def test_the_prompt_bound_holds_and_is_tight_on_the_densest_text(tokenizer):
    """The densest text there is, the vocabulary's longest token (a newline and 80 spaces) over and
    over: its tokens are never fewer than its bytes / the bound (no text is refused that fits), and
    barely more (the bound refuses what cannot fit, not much later)."""
    fit = PromptFit.of(tokenizer)
    assert fit.longest_token_bytes == 81  # SmolLM2's "\n" + 80 spaces
    text = ("\n" + " " * 80) * 100 + "x"
    size, n = len(text.encode()), len(tokenizer.encode(text))
    assert n * fit.longest_token_bytes >= size and n <= -(-size // fit.longest_token_bytes) + 2, (n, size)
    fit.check(text, n)  # fits a context of its own length: left to build_request, which counts it
    with pytest.raises(Exception, match="prompt is too long: at least 101 tokens > 98 maximum"):
        fit.check(text, 99)


@pytest.fixture(scope="module")
def limited():
    with ServerProcess(engine_cmd=mock_engine_cmd(), extra=["--max-body-mb", "1"]) as server:
        yield server


def big_chat(size: int) -> bytes:
    head, tail = b'{"messages": [{"role": "user", "content": "', b'"}], "max_tokens": 1}'
    return head + b"a" * (size - len(head) - len(tail)) + tail


def sent(body: bytes, declared: bool):
    """The body as httpx sends it: whole with its Content-Length, or as a stream, chunked."""
    return body if declared else iter([body[i:i + 65536] for i in range(0, len(body), 65536)])


@pytest.mark.parametrize("declared", [True, False])
def test_413_in_openai_s_shape_naming_the_flag(limited, declared):
    r = httpx.post(limited.url + "/v1/chat/completions", content=sent(big_chat(2 * MIB), declared), timeout=60,
                   headers={"content-type": "application/json"})
    assert r.status_code == 413, r.text
    assert r.json() == {"error": {"message": "the request body is larger than this server's limit of 1 MiB "
                                             "(--max-body-mb 1): send a shorter request, or start the server "
                                             "with a higher --max-body-mb",
                                  "type": "invalid_request_error", "param": None, "code": "request_too_large"}}


@pytest.mark.parametrize("declared", [True, False])
def test_413_in_anthropic_s_shape_on_its_paths(limited, declared):
    head = b'{"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": "'
    r = httpx.post(limited.url + "/v1/messages", content=sent(head + b"a" * 2 * MIB + b'"}]}', declared), timeout=60,
                   headers={"content-type": "application/json"})
    assert r.status_code == 413, r.text
    assert r.json()["type"] == "error" and r.json()["error"]["type"] == "request_too_large"
    assert "--max-body-mb 1" in r.json()["error"]["message"]


def test_a_body_under_the_limit_is_served(limited):
    r = httpx.post(limited.url + "/v1/completions", json={"prompt": "hi " * 1000, "max_tokens": 2}, timeout=60)
    assert r.status_code == 200, r.text


def test_no_limit_with_0(server_factory):
    server = server_factory(engine_cmd=mock_engine_cmd(), extra=["--max-body-mb", "0"])
    r = httpx.post(server.url + "/v1/chat/completions", content=big_chat(5 * MIB), timeout=60,
                   headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["message"].startswith("prompt is too long: at least "), r.text


TOOL = {"name": "get_weather", "description": "The weather in a city",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


def test_messages_and_responses_answer_with_their_prompts_prepared_in_threads(limited):
    """/v1/messages (whole, streamed, count_tokens) and /v1/responses (with a stored history) render
    and encode in worker threads (serve/api/prompt_tokens.py): each shape still answers."""
    url = limited.url + "/v1"
    turns = [{"role": "user", "content": "Weather in Paris?"},
             {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "get_weather",
                                                "input": {"city": "Paris"}}]},
             {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "sunny"}]}]
    for stream in (False, True):
        r = httpx.post(url + "/messages", timeout=60, json={"model": "m", "max_tokens": 4, "system": "Be brief.",
                                                           "tools": [TOOL], "messages": turns, "stream": stream})
        assert r.status_code == 200, r.text
    assert httpx.post(url + "/messages/count_tokens", json={"model": "m", "messages": turns, "tools": [TOOL]},
                      timeout=60).json()["input_tokens"] > 0
    function = {"type": "function", "name": TOOL["name"], "parameters": TOOL["input_schema"]}
    first = httpx.post(url + "/responses", timeout=60, json={"input": "Weather in Paris?", "instructions": "Be brief.",
                                                             "tools": [function], "max_output_tokens": 4})
    assert first.status_code == 200, first.text
    r = httpx.post(url + "/responses", timeout=60, json={"input": "And in Rome?", "max_output_tokens": 4,
                                                         "previous_response_id": first.json()["id"], "stream": True})
    assert r.status_code == 200, r.text
