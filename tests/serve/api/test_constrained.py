"""Constrained decoding on the real engine and the real default model (serve/api/constraints.py,
engine/runner/grammar_mask.py): json_schema outputs validate against their schema, tool_choice "required" or a
named function always gives a parseable call whose arguments match the function's parameters, on
both APIs; a bad schema is a 400, and the protocol carries a grammar the engine refuses as an ERR."""
from __future__ import annotations

import json

import anthropic
import jsonschema
import openai
import pytest

from tests.harness import ServerProcess

SCHEMAS = [
    {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                      "age": {"type": "integer", "minimum": 0, "maximum": 120}},
     "required": ["name", "age"], "additionalProperties": False},
    {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]}, "ok": {"type": "boolean"}},
     "required": ["color", "ok"], "additionalProperties": False},
    {"type": "object", "properties": {"tags": {"type": "array", "items": {"type": "string", "maxLength": 10},
                                               "minItems": 1, "maxItems": 3}},
     "required": ["tags"], "additionalProperties": False},
    {"type": "object", "properties": {"point": {"type": "object", "properties": {"x": {"type": "number"},
                                                                             "y": {"type": "number"}},
                                                "required": ["x", "y"], "additionalProperties": False}},
     "required": ["point"], "additionalProperties": False},
]
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30},
                                                    "unit": {"enum": ["celsius", "fahrenheit"]}},
                   "required": ["city", "unit"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"zone": {"type": "string", "maxLength": 20}}, "required": ["zone"],
    "additionalProperties": False}}}


@pytest.fixture(scope="module")
def server():
    with ServerProcess().start(timeout_s=300) as s:  # the real engine, the default model, on the CPU
        yield s


def test_json_schema_outputs_validate(server):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    for i, target in enumerate(SCHEMAS):
        for temperature in (0.0, 0.9):
            r = client.chat.completions.create(
                model="any", messages=[{"role": "user", "content": "Describe a person, a color, some tags or a point."}],
                response_format={"type": "json_schema", "json_schema": {"name": f"s{i}", "schema": target}},
                max_tokens=120, temperature=temperature, seed=7)
            assert r.choices[0].finish_reason == "stop", r.choices[0].message.content
            jsonschema.validate(json.loads(r.choices[0].message.content), target)


def test_required_and_named_tool_choice_always_give_a_call(server):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    messages = [{"role": "user", "content": "What is the weather in Oslo, and the time in Tokyo?"}]
    for choice, names in (("required", {"get_weather", "get_time"}),
                          ({"type": "function", "function": {"name": "get_time"}}, {"get_time"})):
        for temperature in (0.0, 0.8) if choice == "required" else (0.0,):  # (one sampled case is enough)
            r = client.chat.completions.create(model="any", messages=messages, tools=[WEATHER, TIME], tool_choice=choice,
                                               max_tokens=150, temperature=temperature, seed=3)
            choice0 = r.choices[0]
            assert choice0.finish_reason == "tool_calls", choice0.message
            assert choice0.message.tool_calls
            for call in choice0.message.tool_calls:
                assert call.function.name in names
                tool = WEATHER if call.function.name == "get_weather" else TIME
                jsonschema.validate(json.loads(call.function.arguments), tool["function"]["parameters"])
    single = client.chat.completions.create(model="any", messages=messages, tools=[WEATHER, TIME], tool_choice="required",
                                            parallel_tool_calls=False, max_tokens=150)
    assert len(single.choices[0].message.tool_calls) == 1
    stream = client.chat.completions.create(model="any", messages=messages, tools=[WEATHER, TIME], tool_choice="required",
                                            max_tokens=150, stream=True)
    chunks = list(stream)
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    assert any(c.choices and c.choices[0].delta.tool_calls for c in chunks)


def test_anthropic_tool_choice_any_gives_tool_use(server):
    client = anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0)
    r = client.messages.create(model="any", max_tokens=150, messages=[{"role": "user", "content": "Weather in Rome?"}],
                               tools=[{"name": "get_weather", "input_schema": WEATHER["function"]["parameters"]}],
                               tool_choice={"type": "any"})
    assert r.stop_reason == "tool_use" and r.content[-1].type == "tool_use"
    jsonschema.validate(r.content[-1].input, WEATHER["function"]["parameters"])


def test_a_bad_schema_is_a_400_and_the_next_request_works(server):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    user = [{"role": "user", "content": "Hi"}]
    for fmt in ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "objekt"}}},
                {"type": "json_schema", "json_schema": {"name": "x"}}):
        with pytest.raises(openai.BadRequestError, match="response_format"):
            client.chat.completions.create(model="any", messages=user, response_format=fmt, max_tokens=10)
    with pytest.raises(openai.BadRequestError, match="tools"):
        client.chat.completions.create(model="any", messages=user, tool_choice="required", max_tokens=10, tools=[
            {"type": "function", "function": {"name": "f", "parameters": {"type": "objekt"}}}])
    r = client.chat.completions.create(model="any", messages=user, response_format={"type": "json_object"},
                                       max_tokens=60, temperature=0)
    assert r.choices[0].message.content.startswith("{")
