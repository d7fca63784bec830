"""/v1/responses, OpenAI's Responses API (serve/http/responses_api.py), with the real openai client against
the server and a mock engine scripting a thinking model's text (Qwen3's template): text, reasoning
and function_call output items whole and streamed (the events in their order), a tool loop both as
a stateless transcript (store: false, as Codex sends it) and through previous_response_id, a
max_output_tokens probe, and bad input as a 400 / 404 in OpenAI's shape."""
from __future__ import annotations

import json

import httpx
import openai
import pytest

from tests.serve.http.test_messages_api import CALLS, qwen3, server  # noqa: F401 (a fixture)

WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


@pytest.fixture(scope="module")
def calling(qwen3):  # noqa: F811
    with server(qwen3, CALLS).start() as s:
        yield s


def client_of(s) -> openai.OpenAI:
    return openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0)


def test_items_whole_a_transcript_loop_and_previous_response_id(calling):
    client = client_of(calling)
    r = client.responses.create(model="any", input="Weather in Paris?", instructions="Be brief.", tools=[WEATHER],
                                max_output_tokens=300)
    assert r.status == "completed" and [item.type for item in r.output] == ["reasoning", "message", "function_call"]
    assert r.output[0].content[0].text.strip() == "The user wants the weather."
    assert r.output_text.strip() == "Checking."
    call = r.output[2]
    assert (call.name, json.loads(call.arguments)) == ("get_weather", {"city": "Paris"}) and call.call_id
    assert r.usage.input_tokens > 0 and r.usage.output_tokens > 0
    # Codex's way: store false, the whole transcript with the call and its output each turn
    again = client.responses.create(model="any", store=False, tools=[WEATHER], max_output_tokens=300, input=[
        {"role": "user", "content": [{"type": "input_text", "text": "Weather in Paris?"}]},
        {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
        {"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 21 C"}])
    assert again.status == "completed" and again.output[-1].type == "function_call"
    with pytest.raises(openai.NotFoundError, match="no stored response"):
        client.responses.create(model="any", previous_response_id=again.id, input="and now?", max_output_tokens=5)
    # the stored way: previous_response_id carries the conversation on
    follow = client.responses.create(model="any", previous_response_id=r.id, tools=[WEATHER], max_output_tokens=300,
                                     input=[{"type": "function_call_output", "call_id": call.call_id,
                                             "output": "sunny"}])
    assert follow.status == "completed" and follow.usage.input_tokens > r.usage.input_tokens


def test_the_stream_sends_the_events_in_their_order(calling):
    client = client_of(calling)
    events = list(client.responses.create(model="any", input="Weather?", tools=[WEATHER], max_output_tokens=300,
                                          stream=True))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    assert [e.sequence_number for e in events] == sorted(e.sequence_number for e in events)
    message_start = kinds.index("response.content_part.added")
    assert kinds[message_start - 1] == "response.output_item.added"
    text_done = kinds.index("response.output_text.done")
    assert kinds[text_done:text_done + 3] == ["response.output_text.done", "response.content_part.done",
                                              "response.output_item.done"]
    assert "response.function_call_arguments.delta" in kinds
    args_done = kinds.index("response.function_call_arguments.done")
    assert kinds[args_done + 1] == "response.output_item.done"
    final = events[-1].response
    assert [item.type for item in final.output] == ["reasoning", "message", "function_call"]
    assert json.loads(final.output[2].arguments) == {"city": "Paris"}
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text.strip() == final.output[1].content[0].text.strip() == "Checking."


def test_a_one_token_probe_is_incomplete_and_bad_input_is_a_400(calling):
    client = client_of(calling)
    probe = client.responses.create(model="any", input="hi", max_output_tokens=1)
    assert probe.status == "incomplete" and probe.incomplete_details.reason == "max_output_tokens"
    bad = httpx.post(calling.url + "/v1/responses", json={"model": "any", "input": [{"type": "computer_call"}]})
    assert bad.status_code == 400 and "computer_call" in bad.json()["error"]["message"]
    bad = httpx.post(calling.url + "/v1/responses", json={"model": "any", "input": "hi",
                                                          "tools": [{"type": "teleport", "name": "go"}]})
    assert bad.status_code == 400 and "teleport" in bad.json()["error"]["message"]
    bad = httpx.post(calling.url + "/v1/responses", json={"model": "any", "input": "hi", "tools": [
        {"type": "custom", "name": "edit", "format": {"type": "grammar", "syntax": "lark", "definition": "start: ("}}]})
    assert bad.status_code == 400 and "not a Lark grammar" in bad.json()["error"]["message"]
    # a tool OpenAI's servers run (web search) cannot run here: left out, the request served
    hosted = client.responses.create(model="any", input="hi", max_output_tokens=5, tools=[{"type": "web_search"}])
    assert hosted.status == "incomplete" and hosted.tools[0].type == "web_search"
    assert client.responses.create(model="any", input="hi", max_output_tokens=300).status == "completed"
