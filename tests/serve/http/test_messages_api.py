"""/v1/messages, Anthropic's Messages API (serve/http/messages_api.py), with the real anthropic client
against the server and a mock engine scripting the model's text: text and tool_use blocks whole and
streamed (input_json_delta), a two-round tool loop with tool_result blocks, thinking blocks from a
thinking model, count_tokens, x-api-key, ?beta=true, and errors in Anthropic's shape."""
from __future__ import annotations

import json
import subprocess
import sys

import anthropic
import httpx
import pytest

from engine.modelfile.tokenizer import load_tokenizer
from tests.harness import ROOT, ServerProcess, mock_engine_cmd

TEMPLATES = ROOT / "tests/fixtures/templates"
WEATHER = {"name": "get_weather", "description": "The weather in a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
CALLS = ('<think>\nThe user wants the weather.\n</think>\n\nChecking.\n<tool_call>\n'
         '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>')


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory):
    path = tmp_path_factory.mktemp("messages") / "qwen3.gguf"
    subprocess.run([sys.executable, str(ROOT / "tools/fixtures/make_synthetic_gguf.py"), str(path), "--layers", "1", "--dim", "64",
                    "--ffn", "64", "--heads", "1", "--kv-heads", "1", "--ctx", "2048", "--type", "F32",
                    "--chat-template", str(TEMPLATES / "Qwen-Qwen3-0.6B.jinja")], check=True, capture_output=True)
    return path


def server(model, output: str, *extra: str) -> ServerProcess:
    tok = load_tokenizer(str(model))
    script = ",".join(map(str, tok.encode(output, add_bos=False) + [tok.special.eos]))
    return ServerProcess(engine_cmd=mock_engine_cmd("--script", script, "--eos", str(tok.special.eos)),
                         extra=["--model", str(model), *extra])


def test_tool_use_whole_and_streamed_and_a_two_round_loop(qwen3):
    with server(qwen3, CALLS, "--api-key", "sekret").start() as s:
        client = anthropic.Anthropic(base_url=s.url, api_key="sekret", max_retries=0)
        messages = [{"role": "user", "content": "What is the weather in Paris?"}]
        args = dict(model="any", max_tokens=300, tools=[WEATHER], system="You are terse.")
        whole = client.messages.create(messages=messages, **args)
        assert whole.stop_reason == "tool_use"
        kinds = [b.type for b in whole.content]
        assert kinds == ["thinking", "text", "tool_use"]
        thinking, text, call = whole.content
        assert thinking.thinking == "The user wants the weather." and text.text == "Checking."
        assert (call.name, call.input) == ("get_weather", {"city": "Paris"}) and call.id
        assert whole.usage.input_tokens > 0 and whole.usage.output_tokens > 0

        with client.messages.stream(messages=messages, **args) as stream:
            events = list(stream)
            final = stream.get_final_message()
        assert [b.type for b in final.content] == kinds and final.stop_reason == "tool_use"
        # a signature on every thinking block, whole and streamed (the same text, the same signature);
        # the loop below sends the blocks back with it
        assert thinking.signature and final.content[0].signature == thinking.signature
        assert final.content[2].input == {"city": "Paris"} and final.content[1].text == "Checking."
        assert any(e.type == "content_block_delta" and e.delta.type == "input_json_delta" for e in events)

        for _ in range(2):  # the agent's loop: the call's result goes back as a tool_result block
            messages += [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in whole.content]},
                         {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id,
                                                       "content": json.dumps({"sky": "clear"})}]}]
            again = client.messages.create(messages=messages, **args)
            prompt = lambda u: u.input_tokens + u.cache_read_input_tokens  # noqa: E731
            assert prompt(again.usage) > prompt(whole.usage)
            assert again.usage.cache_read_input_tokens > 0  # the history's start was still in the prefix cache
            whole, call = again, again.content[-1]
            assert call.type == "tool_use"
        count = client.messages.count_tokens(model="any", messages=messages, tools=[WEATHER], system="You are terse.")
        assert count.input_tokens == prompt(again.usage)


def test_text_answers_stop_reasons_and_beta_query(qwen3):
    with server(qwen3, "Just words, no tools.").start() as s:
        client = anthropic.Anthropic(base_url=s.url, api_key="unused", max_retries=0)
        r = client.messages.create(model="any", max_tokens=300, messages=[{"role": "user", "content": "Hi"}],
                                   thinking={"type": "disabled"})
        assert [b.type for b in r.content] == ["text"] and r.content[0].text == "Just words, no tools."
        assert r.stop_reason == "end_turn"
        short = client.messages.create(model="any", max_tokens=2, messages=[{"role": "user", "content": "Hi"}])
        assert short.stop_reason == "max_tokens" and short.usage.output_tokens == 2
        stopped = client.messages.create(model="any", max_tokens=300, messages=[{"role": "user", "content": "Hi"}],
                                         stop_sequences=["no tools", "words"])
        assert (stopped.stop_reason, stopped.stop_sequence) == ("stop_sequence", "words")
        assert stopped.content[0].text == "Just "
        with client.messages.stream(model="any", max_tokens=300, messages=[{"role": "user", "content": "Hi"}],
                                    stop_sequences=["tools"]) as stream:
            final = stream.get_final_message()
        assert (final.stop_reason, final.stop_sequence, final.content[0].text) == ("stop_sequence", "tools",
                                                                                  "Just words, no ")
        raw = httpx.post(s.url + "/v1/messages?beta=true", json={"model": "any", "max_tokens": 50, "messages": [
            {"role": "user", "content": [{"type": "text", "text": "Hi"}]}], "system": [{"type": "text", "text": "Be kind."}]})
        assert raw.status_code == 200 and raw.json()["content"][0]["text"] == "Just words, no tools."
        # Claude Code's contract: its headers taken, message_start's usage counts the prompt (cache fields
        # present), a ping at once after it
        headers = {"anthropic-version": "2023-06-01", "anthropic-beta": "interleaved-thinking-2025-05-14"}
        with httpx.stream("POST", s.url + "/v1/messages", headers=headers, json={
                "model": "any", "max_tokens": 50, "stream": True, "messages": [{"role": "user", "content": "Hi"}]}) as r:
            events = [json.loads(line[len("data: "):]) for line in r.iter_lines() if line.startswith("data: ")]
        assert [e["type"] for e in events[:2]] == ["message_start", "ping"]
        usage = events[0]["message"]["usage"]
        assert usage["input_tokens"] > 0 and usage["cache_read_input_tokens"] == 0
        assert usage["cache_creation_input_tokens"] == 0 and events[-1]["type"] == "message_stop"


def test_errors_take_anthropic_shape_and_the_next_request_works(qwen3):
    with server(qwen3, "fine", "--api-key", "sekret").start() as s:
        client = anthropic.Anthropic(base_url=s.url, api_key="sekret", max_retries=0)
        user = [{"role": "user", "content": "Hi"}]
        with pytest.raises(anthropic.AuthenticationError):
            anthropic.Anthropic(base_url=s.url, api_key="wrong", max_retries=0).messages.create(
                model="any", max_tokens=10, messages=user)
        with pytest.raises(anthropic.BadRequestError, match="exceeds the context") as e:
            client.messages.create(model="any", max_tokens=9000, messages=user)  # the mock holds 8192
        assert e.value.body["type"] == "error" and e.value.body["error"]["type"] == "invalid_request_error"
        with pytest.raises(anthropic.BadRequestError, match=r"prompt is too long: \d+ tokens > 8191 maximum"):
            client.messages.create(model="any", max_tokens=10, messages=[{"role": "user", "content": "word " * 9000}])
        with pytest.raises(anthropic.BadRequestError, match="not among the tools"):
            client.messages.create(model="any", max_tokens=10, messages=user, tools=[WEATHER],
                                   tool_choice={"type": "tool", "name": "nope"})
        with pytest.raises(anthropic.BadRequestError, match="no assistant tool call"):
            client.messages.create(model="any", max_tokens=10, messages=[
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "x"}]}])
        missing = httpx.post(s.url + "/v1/messages", headers={"x-api-key": "sekret"},
                             json={"model": "any", "messages": user})
        assert missing.status_code == 400 and missing.json()["error"]["message"].startswith("max_tokens")
        assert client.messages.create(model="any", max_tokens=10, messages=user).content[0].text == "fine"


def test_a_per_request_billing_line_is_normalized_away_so_prefixes_stay_shared():
    from serve.api.anthropic_schema import CountTokensRequest
    from serve.http.messages_api import chat_request

    def system_of(header: str) -> str:
        body = CountTokensRequest(model="any", messages=[{"role": "user", "content": "Hi"}], system=[
            {"type": "text", "text": f"x-anthropic-billing-header: cc_version=2.0.1; cch={header};"},
            {"type": "text", "text": "You are a coding agent.\nUse the tools."}])
        return chat_request(body)[0].messages[0].content

    assert system_of("a1b2") == system_of("ffff") == "You are a coding agent.\nUse the tools."
    body = CountTokensRequest(model="any", messages=[{"role": "user", "content": "Hi"}],
                              system="Keep x-anthropic-billing-header: mentions that are not the first line.")
    assert "billing" in chat_request(body)[0].messages[0].content
