"""Tool calls and JSON on a real trained model with a real vocabulary (chat completions, Anthropic
messages and the Responses API): Qwen2.5-Coder-0.5B-Instruct
(Q4_K_M, `make fixture` fetches and checks it) on the CPU, through the openai client. Its template
writes calls as Hermes <tool_call> tags, and its vocabulary has <tool_call> and </tool_call> as
added tokens: the grammar must take the token the model writes, not only the text (before, the
mask offered the token and the grammar refused it, ending the answer empty). The server: qwen_server
(tests/serve/conftest.py), shared with the fill-in-the-middle tests."""
from __future__ import annotations

import json

import anthropic
import jsonschema
import openai
import pytest

WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                           "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time", "description": "The local time in a city",
                                           "parameters": WEATHER}}]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def qwen(qwen_server):
    return openai.OpenAI(base_url=qwen_server.url + "/v1", api_key="unused", max_retries=0, timeout=300)


def test_required_gives_a_call_whose_arguments_fit_the_schema(qwen):
    r = qwen.chat.completions.create(model="qwen", messages=ASK, tools=TOOLS, tool_choice="required",
                                     parallel_tool_calls=False, max_tokens=40, temperature=0)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and len(choice.message.tool_calls) == 1, choice
    call = choice.message.tool_calls[0].function
    assert call.name in ("get_weather", "get_time")
    jsonschema.validate(json.loads(call.arguments), WEATHER)


def test_a_named_function_streamed_gives_that_call(qwen):
    stream = qwen.chat.completions.create(model="qwen", messages=ASK, tools=TOOLS, max_tokens=40, temperature=0,
                                          tool_choice={"type": "function", "function": {"name": "get_time"}},
                                          parallel_tool_calls=False, stream=True)
    calls, finish = {}, None
    for chunk in stream:
        delta = chunk.choices[0].delta if chunk.choices else None
        for part in (delta.tool_calls or []) if delta else []:
            entry = calls.setdefault(part.index, {"name": "", "arguments": ""})
            entry["name"] += part.function.name or ""
            entry["arguments"] += part.function.arguments or ""
        if chunk.choices and chunk.choices[0].finish_reason:
            finish = chunk.choices[0].finish_reason
    assert finish == "tool_calls" and [c["name"] for c in calls.values()] == ["get_time"], (finish, calls)
    jsonschema.validate(json.loads(calls[0]["arguments"]), WEATHER)


def test_auto_takes_the_bare_call_the_small_model_writes(qwen):
    """Offered tools, this model answers with the call as bare JSON, without its <tool_call> tags:
    it names an offered tool with fitting arguments, so it is a call, not content."""
    r = qwen.chat.completions.create(model="qwen", messages=ASK, tools=TOOLS, tool_choice="auto", max_tokens=40,
                                     temperature=0)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.tool_calls, choice
    assert not choice.message.content
    call = choice.message.tool_calls[0].function
    assert call.name == "get_weather" and json.loads(call.arguments) == {"city": "Paris"}


def test_anthropic_any_gives_a_tool_use_whose_input_fits(qwen_server):
    client = anthropic.Anthropic(base_url=qwen_server.url, api_key="unused", max_retries=0, timeout=300)
    r = client.messages.create(model="qwen", max_tokens=40, messages=ASK,
                               tool_choice={"type": "any", "disable_parallel_tool_use": True},
                               tools=[{"name": t["function"]["name"], "description": t["function"]["description"],
                                       "input_schema": WEATHER} for t in TOOLS])
    uses = [b for b in r.content if b.type == "tool_use"]
    assert r.stop_reason == "tool_use" and uses, r
    jsonschema.validate(uses[0].input, WEATHER)


def test_the_responses_api_gives_a_function_call_item(qwen):
    r = qwen.responses.create(model="qwen", input="What is the weather in Paris?", max_output_tokens=40, temperature=0,
                              tools=[{"type": "function"} | t["function"] for t in TOOLS])
    calls = [item for item in r.output if item.type == "function_call"]
    assert r.status == "completed" and calls, r.output
    jsonschema.validate(json.loads(calls[0].arguments), WEATHER)


def test_a_json_schema_answer_validates(qwen):
    schema_ = {"type": "object", "properties": {"city": {"type": "string"}, "country": {"type": "string"}},
               "required": ["city", "country"]}
    r = qwen.chat.completions.create(model="qwen", max_tokens=40, temperature=0, messages=[
        {"role": "user", "content": "Name a city in France, as JSON."}],
        response_format={"type": "json_schema", "json_schema": {"name": "place", "schema": schema_}})
    jsonschema.validate(json.loads(r.choices[0].message.content), schema_)


def test_codex_apply_patch_and_a_namespaced_tool(qwen):
    """Codex's own tools on the real model: its apply_patch custom tool (a Lark grammar) gives a
    custom_tool_call whose input is a patch the grammar accepts, as llguidance's Lark parser reads
    it; an MCP tool in a namespace comes back under its own name and namespace."""
    from tests.serve.api.test_codex_tools import DOCS, PATCH_GRAMMAR
    from tests.serve.api.test_lark_regex import APPLY_PATCH, parses
    ask = "In calc.py the function add returns a - b. Fix it so that it returns a + b."
    r = qwen.responses.create(model="qwen", input=ask, instructions="You are a coding agent.", store=False,
                              tools=[DOCS, PATCH_GRAMMAR], tool_choice={"type": "custom", "name": "apply_patch"},
                              max_output_tokens=120, temperature=0)
    assert r.status == "completed" and [item.type for item in r.output] == ["custom_tool_call"], r.output
    assert r.output[0].name == "apply_patch" and parses(APPLY_PATCH, r.output[0].input), r.output[0].input
    r = qwen.responses.create(model="qwen", input="Search the docs for 'rope scaling'.", store=False, tools=[DOCS],
                              tool_choice="required", max_output_tokens=60, temperature=0)
    assert [(item.type, item.name, item.namespace) for item in r.output] == [("function_call", "search", "docs")]
    assert json.loads(r.output[0].arguments)["query"]


def test_a_two_round_tool_loop_streamed_and_over_responses(qwen):
    """The whole loop on the real model: a streamed auto call, the tool's result sent back, and an
    answer in words; then the same through /v1/responses with a function_call_output item."""
    stream = qwen.chat.completions.create(model="qwen", messages=ASK, tools=TOOLS, max_tokens=40, temperature=0,
                                          stream=True)
    calls, finish = {}, None
    for chunk in stream:
        for part in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            entry = calls.setdefault(part.index, {"id": "", "name": "", "arguments": ""})
            entry["id"] += part.id or ""
            entry["name"] += part.function.name or ""
            entry["arguments"] += part.function.arguments or ""
        if chunk.choices and chunk.choices[0].finish_reason:
            finish = chunk.choices[0].finish_reason
    assert finish == "tool_calls" and calls[0]["name"] == "get_weather", (finish, calls)
    call = calls[0]
    messages = ASK + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": call["id"], "type": "function", "function": {"name": call["name"], "arguments": call["arguments"]}}]},
        {"role": "tool", "tool_call_id": call["id"], "content": '{"sky": "sunny", "celsius": 21}'}]
    answer = qwen.chat.completions.create(model="qwen", messages=messages, tools=TOOLS, max_tokens=60, temperature=0)
    assert answer.choices[0].finish_reason == "stop" and answer.choices[0].message.content.strip(), answer
    assert not answer.choices[0].message.tool_calls
    tools = [{"type": "function"} | t["function"] for t in TOOLS]
    first = qwen.responses.create(model="qwen", input="What is the weather in Paris?", tools=tools, store=False,
                                  max_output_tokens=40, temperature=0)
    item = next(i for i in first.output if i.type == "function_call")
    second = qwen.responses.create(model="qwen", tools=tools, store=False, max_output_tokens=60, temperature=0, input=[
        {"role": "user", "content": "What is the weather in Paris?"}, item.model_dump(exclude_none=True),
        {"type": "function_call_output", "call_id": item.call_id, "output": '{"sky": "sunny", "celsius": 21}'}])
    assert second.status == "completed" and second.output_text.strip(), second.output
