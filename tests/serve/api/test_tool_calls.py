"""Tool calls (serve/api/tool_calls.py, serve/api/chat.py): each family's native format parsed from any cut
of the output into stream pieces alike; through the server with the real openai client, a mock
engine scripting each format's output: the same calls streamed and not, finish_reason tool_calls,
a two-round tool loop with the results rendered by the model's template, a call cut off by
max_tokens never reported, and bad tool input answered with 400s."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import openai
import pytest
from hypothesis import given, example, strategies as st

from engine.modelfile.tokenizer import load_tokenizer
from serve.api.tool_calls import FORMATS, ToolCallStream, format_for_template, parse_all
from tests.harness import ROOT, ServerProcess, mock_engine_cmd

TEMPLATES = ROOT / "tests/fixtures/templates"
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                   "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}

# A minimal template in the form Qwen3-Coder's renders calls (<function=...><parameter=...>), written
# for these tests: the format is chosen by those markers.
XML_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\nTools: {% for t in tools %}{{ t.function.name }} {% endfor %}<|im_end|>\n{% endif %}"
    "{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
    "{%- for c in m.tool_calls or [] %}<tool_call>\n<function={{ c.function.name }}>\n"
    "{%- for k, v in c.function.arguments | items %}<parameter={{ k }}>\n{{ v }}\n</parameter>\n{% endfor %}"
    "</function>\n</tool_call>{% endfor %}<|im_end|>\n{% endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")

OUTPUTS = {  # format -> the model's text for two calls (or one where the format has one), and what it means
    "hermes": ('Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}\n'
               '</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>',
               "Let me look.", [("get_weather", {"city": "Paris", "days": 2}), ("get_time", {})]),
    "qwen3-coder": ("<tool_call>\n<function=get_weather>\n<parameter=city>\n2024\n</parameter>\n<parameter=days>\n2\n"
                    "</parameter>\n</function>\n</tool_call>",
                    "", [("get_weather", {"city": "2024", "days": 2})]),
    "llama3": ('{"name": "get_weather", "parameters": {"city": "Paris", "days": 2}}',
               "", [("get_weather", {"city": "Paris", "days": 2})]),
    "generic": ('{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}, '
                '{"name": "get_time", "arguments": {}}]}',
                "", [("get_weather", {"city": "Paris", "days": 2}), ("get_time", {})]),
}


def meaning(calls) -> list[tuple[str, dict]]:
    return [(c.name, json.loads(c.arguments)) for c in calls]


@pytest.mark.parametrize("fmt", sorted(OUTPUTS))
def test_each_format_parses_its_calls(fmt):
    text, content, calls = OUTPUTS[fmt]
    got_content, got_calls, cut = parse_all(FORMATS[fmt], text, stopped=True, tools=[WEATHER, TIME])
    assert (got_content, meaning(got_calls), cut) == (content, calls, False)


def test_templates_choose_their_format():
    assert format_for_template((TEMPLATES / "Qwen-Qwen3-0.6B.jinja").read_text()).name == "hermes"
    assert format_for_template((TEMPLATES / "Qwen-Qwen2.5-7B-Instruct.jinja").read_text()).name == "hermes"
    assert format_for_template((TEMPLATES / "meta-llama-Llama-3.1-8B-Instruct.jinja").read_text()).name == "llama3"
    assert format_for_template(XML_TEMPLATE + "<tool_call>").name == "qwen3-coder"
    assert format_for_template((TEMPLATES / "Qwen-Qwen3.5-4B.jinja").read_text()).name == "qwen3-coder"
    assert format_for_template("{{ messages }}").name == "generic"


def test_text_that_is_not_a_call_stays_content():
    hermes = FORMATS["hermes"]
    assert parse_all(hermes, "a <tool_call>{not json}</tool_call> b", True)[:2] == ("a <tool_call>{not json}</tool_call> b", [])
    assert parse_all(hermes, "x < y, and <tool_ is not a tag", True)[:2] == ("x < y, and <tool_ is not a tag", [])
    assert parse_all(FORMATS["llama3"], '{"answer": 42}', True)[:2] == ('{"answer": 42}', [])
    assert parse_all(FORMATS["generic"], '{"response": "It is sunny."}', True)[:2] == ("It is sunny.", [])
    assert parse_all(FORMATS["generic"], "Plain words.", True)[:2] == ("Plain words.", [])


def test_a_call_cut_off_is_dropped_never_half_reported():
    content, calls, cut = parse_all(FORMATS["hermes"], 'Sure.\n<tool_call>\n{"name": "get_weather", "argu', False)
    assert (content, calls, cut) == ("Sure.", [], True)
    content, calls, cut = parse_all(FORMATS["llama3"], '{"name": "get_weather", "parameters": {"ci', False)
    assert (content, calls, cut) == ("", [], True)  # Llama 3's call is the whole answer: this one was cut
    assert parse_all(FORMATS["llama3"], '{"answer": 4', False)[:3] == ('{"answer": 4', [], False)  # JSON, no call
    content, calls, cut = parse_all(FORMATS["generic"], '{"tool_calls": [{"name": "get_time", "arguments": {}}, '
                                                        '{"name": "get_weather", "arguments": {"ci', False)
    assert (content, meaning(calls), cut) == ("", [("get_time", {})], True)  # the whole call before the cut is kept
    content, calls, cut = parse_all(FORMATS["generic"], '{"tool_calls": [{"name": "get_time", "arguments": {}}]', False)
    assert (content, meaning(calls), cut) == ("", [("get_time", {})], True)  # cut before its last brace
    assert parse_all(FORMATS["hermes"], "Sure.\n<tool_", False)[:3] == ("Sure.", [], False)
    for cut, words in (('{"response": "It is sunny in Par', "It is sunny in Par"), ('{"response": "It is \\"sun', 'It is "sun'),
                       ('{"response": "It is sunny."', "It is sunny."), ('{"response": "It is \\u00e9t', "It is \u00e9t"),
                       ('{"response": "It is \\u00', "It is ")):  # the generic answer in words, cut: its words so far
        assert parse_all(FORMATS["generic"], cut, False)[:3] == (words, [], False), cut


CASES = [(fmt, text, stopped) for fmt, (text, _, _) in OUTPUTS.items() for stopped in (True, False)] + [
    ("hermes", "no calls at all, just <b>text</b>  \n", True), ("hermes", "<tool_call>{\"name\": \"x\"", False),
    ("hermes", "a <tool_call>{bad}</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call> z", True),
    ("generic", '  {"response": "fine"}', True), ("llama3", "Not JSON at all.", True),
    ("hermes", '{"name": "get_weather", "arguments": {"city": "Paris"}}', True),
    ("hermes", '```json\n[{"name": "get_time", "arguments": {}}, {"name": "get_weather", "arguments": {"city": "Oslo"}}]\n```', True),
    ("hermes", '{"name": "get_weather", "arguments": {"city": 3}}', True), ("hermes", "```python\nprint(1)\n```", True),
    ("hermes", 'I will look.\n```json\n{"name": "get_time", "arguments": {}}\n```\nDone.', True),
    ("qwen3-coder", "Code:\n```python\nprint(1)\n```\nand ``` unclosed", True)]


@pytest.mark.parametrize("fmt", ["hermes", "qwen3-coder", "generic"])
def test_a_bare_call_naming_an_offered_tool_with_fitting_arguments_is_a_call(fmt):
    """Small models skip their format's markers; the bare call (or list, or ```json fence) is taken
    when every object names an offered tool and its arguments fit the tool's schema."""
    tools = [WEATHER, TIME]
    for text in ('{"name": "get_weather", "arguments": {"city": "Paris"}}',
                 '  ```json\n{"name": "get_weather", "arguments": "{\\"city\\": \\"Paris\\"}"}\n```\n'):
        content, calls, cut = parse_all(FORMATS[fmt], text, True, tools)
        assert (content, meaning(calls), cut) == ("", [("get_weather", {"city": "Paris"})], False), text
    content, calls, _ = parse_all(FORMATS[fmt], '[{"name": "get_time", "arguments": {}}, {"name": "get_weather", '
                                              '"parameters": {"city": "Oslo", "days": 2}}]', True, tools)
    assert meaning(calls) == [("get_time", {}), ("get_weather", {"city": "Oslo", "days": 2})] and content == ""
    several = '```json\n{"name": "get_time", "arguments": {}}\n\n{"name": "get_weather", "arguments": {"city": "Rome"}},\n```'
    content, calls, _ = parse_all(FORMATS[fmt], several, True, tools)  # one after another, as small models write
    assert meaning(calls) == [("get_time", {}), ("get_weather", {"city": "Rome"})] and content == ""
    for text in ('{"name": "get_weather", "arguments": {"days": 2}}',  # misses the required city
                 '{"name": "get_weather", "arguments": {"city": 3}}',  # the wrong type
                 '{"name": "send_mail", "arguments": {}}',  # not an offered tool
                 '{"name": "get_weather", "arguments": {"city": "Paris"}} and more words'):
        assert parse_all(FORMATS[fmt], text, True, tools)[:2] == (text, []), text
    text = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
    assert parse_all(FORMATS[fmt], text, False, tools)[:2] == (text, [])  # cut off by max_tokens: not a call
    if fmt != "generic":  # calls after text, in a fence (the generic format's answer is JSON from its start)
        text = 'Let me check.\n```json\n{"name": "get_time", "arguments": {}}\n```'
        content, calls, _ = parse_all(FORMATS[fmt], text, True, tools)
        assert (content, meaning(calls)) == ("Let me check.", [("get_time", {})])
        code = "Run this:\n```python\nprint(1)\n```\nThen tell me."
        assert parse_all(FORMATS[fmt], code, True, tools)[:2] == (code, [])


@given(st.sampled_from(CASES), st.lists(st.floats(0, 1), max_size=12))
def test_any_cut_into_pieces_parses_alike(case, fractions):
    fmt, text, stopped = case
    bounds = sorted({0, len(text), *(int(f * len(text)) for f in fractions)})
    stream, content, calls = ToolCallStream(FORMATS[fmt], [WEATHER, TIME]), "", []
    for a, b in zip(bounds, bounds[1:]):
        events = stream.feed(text[a:b])
        content += "".join(v for k, v in events if k == "content")
        calls += [v for k, v in events if k == "call"]
    events = stream.finish(stopped)
    content += "".join(v for k, v in events if k == "content")
    calls += [v for k, v in events if k == "call"]
    whole_content, whole_calls, whole_cut = parse_all(FORMATS[fmt], text, stopped, [WEATHER, TIME])
    assert (content, meaning(calls), stream.cut) == (whole_content, meaning(whole_calls), whole_cut)


def write_calls(fmt: str, calls: list[tuple[str, dict]], lead: str) -> tuple[str, list[tuple[int, int]]]:
    """A model's answer making these calls in a format, and the span of each call's text in it (past
    its opening marker, to its end): a cut inside a span cuts that call."""
    if fmt == "generic":
        parts = [json.dumps({"name": n, "arguments": a}) for n, a in calls]
        text, spans = '{"tool_calls": [', []
        for i, part in enumerate(parts):
            text += (", " if i else "") + part
            spans.append((1, len(text)))  # the answer is the list: a cut anywhere in it is in a call
        return text + "]}", spans
    if fmt == "llama3":
        text = json.dumps({"name": calls[0][0], "parameters": calls[0][1]})
        return text, [(1, len(text))]
    text, spans = lead, []
    for name, args in calls:
        if fmt == "hermes":
            body = "\n" + json.dumps({"name": name, "arguments": args}) + "\n"
        else:
            body = f"\n<function={name}>\n" + "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in args.items())
            body += "</function>\n"
        text += ("\n" if text else "") + "<tool_call>"
        start = len(text)
        text += body + "</tool_call>"
        spans.append((start, len(text)))
    return text, spans


CALL = st.one_of(st.builds(lambda city, days: ("get_weather", {"city": city} | ({"days": days} if days else {})),
                           st.sampled_from(["Paris", "Oslo", "San José", "a<b"]), st.integers(0, 9)),
                 st.just(("get_time", {})))


@given(st.sampled_from(sorted(OUTPUTS)), st.lists(CALL, min_size=1, max_size=4), st.sampled_from(["", "Let me see."]),
       st.floats(0, 1), st.lists(st.floats(0, 1), max_size=6))
@example("generic", [("get_time", {})], "", 0.984375, [])  # cut between the list's ']' and the answer's '}'
@example("generic", [("get_time", {})], "", 0.97, [])  # ... and between the call's '}' and the list's ']'
def test_a_cut_anywhere_keeps_the_whole_calls_before_it_and_drops_the_rest(fmt, calls, lead, where, pieces):
    """max_tokens may end an answer at any character: the calls whole before the cut come back (in
    every format, streamed in any pieces), the one being written never does, nor any part of it as
    text, and the answer says it was cut when a call was."""
    if fmt == "llama3":
        calls, lead = calls[:1], ""
    if fmt == "qwen3-coder" or "<" in json.dumps(calls):  # the XML form's values are bare text: no '<' in them
        calls = [(n, {k: v for k, v in a.items() if "<" not in str(v)}) for n, a in calls]
    text, spans = write_calls(fmt, calls, lead)
    cut_at = int(where * len(text))
    cut = text[:cut_at]
    bounds = sorted({0, cut_at, *(int(f * cut_at) for f in pieces)})
    stream, content, got = ToolCallStream(FORMATS[fmt], [WEATHER, TIME]), "", []
    for a, b in zip(bounds, bounds[1:]):
        for kind, value in stream.feed(cut[a:b]) + ([] if b < cut_at else stream.finish(stopped=False)):
            content, got = (content + value, got) if kind == "content" else (content, got + [value])
    if cut_at == 0:
        stream.finish(stopped=False)
    whole = [call for call, (_, end) in zip(calls, spans) if end <= cut_at]
    assert meaning(got) == [(n, json.loads(json.dumps(a))) for n, a in whole]
    assert lead.startswith(content.strip()), content  # text of a call never leaks out as content
    inside = any(start <= cut_at < end for start, end in spans) or (
        fmt == "llama3" and 0 < cut_at < len(text) and not whole) or (
        fmt == "generic" and 0 < cut_at < len(text))  # the answer is one object: cut before its last brace is cut
    assert stream.cut == inside, (cut, stream.cut)


# ---------------------------------------------------------------- through the server

def model_with_template(folder: Path, name: str, template: str | None) -> Path:
    """A tiny model file carrying `template` (the server reads its tokenizer and template; the mock
    engine answers)."""
    path = folder / f"{name}.gguf"
    extra = []
    if template is not None:
        (folder / f"{name}.jinja").write_text(template)
        extra = ["--chat-template", str(folder / f"{name}.jinja")]
    subprocess.run([sys.executable, str(ROOT / "tools/fixtures/make_synthetic_gguf.py"), str(path), "--layers", "1", "--dim", "64",
                    "--ffn", "64", "--heads", "1", "--kv-heads", "1", "--ctx", "2048", "--type", "F32", *extra],
                   check=True, capture_output=True)
    return path


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("tools")
    return {"hermes": model_with_template(folder, "qwen3", (TEMPLATES / "Qwen-Qwen3-0.6B.jinja").read_text()),
            "llama3": model_with_template(folder, "llama31", (TEMPLATES / "meta-llama-Llama-3.1-8B-Instruct.jinja").read_text()),
            "qwen3-coder": model_with_template(folder, "xml", XML_TEMPLATE),
            "generic": model_with_template(folder, "smollm", None)}  # the default model's tokenizer and template


def server(model: Path, output: str) -> ServerProcess:
    tok = load_tokenizer(str(model))
    script = ",".join(map(str, tok.encode(output, add_bos=False) + [tok.special.eos]))
    return ServerProcess(engine_cmd=mock_engine_cmd("--script", script, "--eos", str(tok.special.eos)),
                         extra=["--model", str(model)])


@pytest.fixture(scope="module")
def hermes(models):
    """The Hermes-format server, answering OUTPUTS["hermes"]'s text, shared by the tests that ask it."""
    with server(models["hermes"], OUTPUTS["hermes"][0]) as s:
        yield s


def server_for(fmt: str, models: dict, request: pytest.FixtureRequest) -> ServerProcess:
    """A started server answering OUTPUTS[fmt]'s text: the shared one for Hermes, else one of its own."""
    if fmt == "hermes":
        return request.getfixturevalue("hermes")
    s = server(models[fmt], OUTPUTS[fmt][0]).start()
    request.addfinalizer(s.stop)
    return s


def calls_of(message) -> list[tuple[str, dict]]:
    return [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls or []]


def streamed(client, **args) -> tuple[str, list[tuple[str, dict]], str, list]:
    """A streamed answer put together as a client would: content, calls (by index), finish reason."""
    content, calls, finish, deltas = "", {}, None, []
    for chunk in client.chat.completions.create(stream=True, **args):
        for choice in chunk.choices:
            delta = choice.delta
            deltas.append(delta)
            content += delta.content or ""
            for call in delta.tool_calls or []:
                entry = calls.setdefault(call.index, {"id": None, "name": "", "arguments": ""})
                entry["id"] = call.id or entry["id"]
                entry["name"] += (call.function.name or "") if call.function else ""
                entry["arguments"] += (call.function.arguments or "") if call.function else ""
            finish = choice.finish_reason or finish
    assert all(c["id"] for c in calls.values())
    return content, [(c["name"], json.loads(c["arguments"])) for _, c in sorted(calls.items())], finish, deltas


@pytest.mark.parametrize("fmt", sorted(OUTPUTS))
def test_the_openai_client_gets_the_calls_streamed_and_not_and_loops_twice(models, fmt, request):
    text, content, calls = OUTPUTS[fmt]
    client = openai.OpenAI(base_url=server_for(fmt, models, request).url + "/v1", api_key="unused", max_retries=0)
    messages = [{"role": "system", "content": "You help with the weather."},
                {"role": "user", "content": "Weather in Paris for two days, and the time?"}]
    args = dict(model="any", tools=[WEATHER, TIME], max_tokens=300)
    whole = client.chat.completions.create(messages=messages, **args)
    choice = whole.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert calls_of(choice.message) == calls and (choice.message.content or "") == content
    got_content, got_calls, finish, deltas = streamed(client, messages=messages, **args)
    assert (got_content, got_calls, finish) == (content, calls, "tool_calls")
    assert not any((d.content or "").count("tool_call") or "get_weather" in (d.content or "") for d in deltas)
    # the tool loop, as agents run it: the calls and their results go back, the model answers again
    for _ in range(2):
        messages.append(choice.message.model_dump(exclude_none=True))
        for call in choice.message.tool_calls:
            messages.append({"role": "tool", "tool_call_id": call.id,
                             "content": json.dumps({"result": f"{call.function.name} ok"})})
        again = client.chat.completions.create(messages=messages, **args)
        assert again.usage.prompt_tokens > whole.usage.prompt_tokens  # the history is rendered
        choice = again.choices[0]
        assert calls_of(choice.message) == calls
    single = client.chat.completions.create(messages=messages[:2], parallel_tool_calls=False, **args)
    assert calls_of(single.choices[0].message) == calls[:1]
    none = client.chat.completions.create(messages=messages[:2], tool_choice="none", **args)
    assert none.choices[0].message.content == text and not none.choices[0].message.tool_calls


def test_a_call_cut_off_by_max_tokens_ends_with_length_and_no_call(hermes):
    client = openai.OpenAI(base_url=hermes.url + "/v1", api_key="unused", max_retries=0)
    args = dict(model="any", messages=[{"role": "user", "content": "Weather?"}], tools=[WEATHER, TIME],
                max_tokens=12)
    whole = client.chat.completions.create(**args)
    assert whole.choices[0].finish_reason == "length" and not whole.choices[0].message.tool_calls
    assert "tool_call" not in (whole.choices[0].message.content or "")
    content, calls, finish, _ = streamed(client, **args)
    assert (calls, finish) == ([], "length") and content == (whole.choices[0].message.content or "")


def test_bad_tool_input_is_a_400_and_the_next_request_works(hermes):
    client = openai.OpenAI(base_url=hermes.url + "/v1", api_key="unused", max_retries=0)
    user = [{"role": "user", "content": "Weather?"}]
    bad = [
        (dict(messages=user, tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "nope"}}),
         "not among the tools"),
        (dict(messages=user, tool_choice="required"), "no tools were given"),
        (dict(messages=user + [{"role": "tool", "tool_call_id": "call_1", "content": "sunny"}], tools=[WEATHER]),
         "no assistant tool call before it"),
        (dict(messages=user + [{"role": "assistant", "tool_calls": [{"id": "call_1", "type": "function", "function": {
            "name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
                               {"role": "tool", "tool_call_id": "call_9", "content": "sunny"}], tools=[WEATHER]),
         "matches no call"),
        (dict(messages=user + [{"role": "assistant", "tool_calls": [{"id": "call_1", "type": "function", "function": {
            "name": "get_weather", "arguments": "{not json"}}]}], tools=[WEATHER]), "not a JSON object"),
        (dict(messages=user, tools=[WEATHER, WEATHER]), "unique"),
        (dict(messages=user, tools=[{"type": "function", "function": {"name": "bad name!"}}]), "tools"),
    ]
    for body, message in bad:
        with pytest.raises(openai.BadRequestError, match=message) as e:
            client.chat.completions.create(model="any", max_tokens=20, **body)
        assert e.value.body["type"] == "invalid_request_error"
    ok = client.chat.completions.create(model="any", messages=user, tools=[WEATHER, TIME], max_tokens=300)
    assert ok.choices[0].finish_reason == "tool_calls"
