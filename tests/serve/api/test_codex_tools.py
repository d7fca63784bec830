"""What Codex CLI sends to /v1/responses as a custom provider: `namespace` tools (its MCP servers)
flattened into chat functions and restored on the way out, and `custom` tools (its apply_patch),
whose input is free text or follows a grammar. Over the mock engine with the real openai client
(items whole and streamed, the next turn's transcript), and the grammar itself against the real
Qwen2.5 vocabulary: under tool_choice auto the model may write text, but a call it opens must be
whole and its patch must follow apply_patch's grammar."""
from __future__ import annotations

import json

import llguidance
import openai
import pytest

from serve.api.chat import ToolPlan
from serve.api.constraints import tool_grammar
from serve.api.response_tools import build as build_tools
from serve.http.responses_api import input_messages
from serve.api.responses_schema import ResponsesRequest
from serve.api.tool_calls import FORMATS
from tests.harness import ROOT
from tests.serve.http.test_messages_api import qwen3, server  # noqa: F401 (a fixture)
from tools.fixtures.fetch_fixture import fixture_path

APPLY_PATCH = (ROOT / "tests/fixtures/apply_patch.lark").read_text()
PATCH = "*** Begin Patch\n*** Update File: calc.py\n@@ def add(a, b):\n-    return a - b\n+    return a + b\n*** End Patch\n"
SEARCH = {"type": "function", "name": "search", "description": "Search the docs",
          "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}}
DOCS = {"type": "namespace", "name": "docs", "description": "The docs server", "tools": [SEARCH]}
PATCH_TEXT = {"type": "custom", "name": "apply_patch", "description": "Edit files with a patch"}
PATCH_GRAMMAR = PATCH_TEXT | {"format": {"type": "grammar", "syntax": "lark", "definition": APPLY_PATCH}}
OUTPUT = ('<tool_call>\n{"name": "docs__search", "arguments": {"query": "patch format"}}\n</tool_call>\n'
          '<tool_call>\n' + json.dumps({"name": "apply_patch", "arguments": {"input": PATCH}}) + '\n</tool_call>')


@pytest.fixture(scope="module")
def codex(qwen3):  # noqa: F811
    with server(qwen3, OUTPUT).start() as s:
        yield openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0)


def test_namespace_and_custom_calls_come_back_as_their_items(codex):
    r = codex.responses.create(model="any", input="Fix calc.py", tools=[DOCS, PATCH_TEXT], store=False,
                               max_output_tokens=300)
    assert r.status == "completed" and [item.type for item in r.output] == ["function_call", "custom_tool_call"]
    search, patch = r.output
    assert (search.name, search.namespace, json.loads(search.arguments)) == ("search", "docs", {"query": "patch format"})
    assert (patch.name, patch.input) == ("apply_patch", PATCH) and patch.call_id
    # the next turn, as Codex sends it: the transcript with both calls and their outputs
    again = codex.responses.create(model="any", tools=[DOCS, PATCH_TEXT], store=False, max_output_tokens=300, input=[
        {"role": "user", "content": [{"type": "input_text", "text": "Fix calc.py"}]},
        search.model_dump(exclude_none=True), {"type": "function_call_output", "call_id": search.call_id, "output": "ok"},
        patch.model_dump(exclude_none=True), {"type": "custom_tool_call_output", "call_id": patch.call_id,
                                              "output": "Done!"}])
    assert again.status == "completed" and again.usage.input_tokens > r.usage.input_tokens


def test_a_custom_call_streams_its_input_events(codex):
    events = list(codex.responses.create(model="any", input="Fix calc.py", tools=[DOCS, PATCH_TEXT],
                                         max_output_tokens=300, stream=True))
    kinds = [e.type for e in events]
    added = [e.item for e in events if e.type == "response.output_item.added"]
    assert [(item.type, item.name) for item in added] == [("function_call", "search"), ("custom_tool_call", "apply_patch")]
    assert added[0].namespace == "docs"
    done = kinds.index("response.custom_tool_call_input.done")
    assert kinds[done - 1] == "response.custom_tool_call_input.delta" and kinds[done + 1] == "response.output_item.done"
    assert events[done].input == PATCH and events[done - 1].delta == PATCH
    final = events[-1].response
    assert final.status == "completed" and final.output[1].input == PATCH and final.output[0].namespace == "docs"


def test_the_transcript_names_namespaced_calls_as_the_model_saw_them():
    body = ResponsesRequest(input=[
        {"type": "function_call", "call_id": "c1", "name": "search", "namespace": "docs", "arguments": '{"query": "x"}'},
        {"type": "custom_tool_call", "call_id": "c2", "name": "apply_patch", "input": PATCH},
        {"type": "function_call_output", "call_id": "c1", "output": "found"},
        {"type": "custom_tool_call_output", "call_id": "c2", "output": "Done!"}])
    call_turn, first, second = input_messages(body)
    assert [c["function"]["name"] for c in call_turn["tool_calls"]] == ["docs__search", "apply_patch"]
    assert json.loads(call_turn["tool_calls"][1]["function"]["arguments"]) == {"input": PATCH}
    assert (first["tool_call_id"], second["tool_call_id"], second["content"]) == ("c1", "c2", "Done!")


@pytest.fixture(scope="module")
def qwen_vocab():
    from engine.modelfile.grammar_tokenizer import GrammarTokenizer
    from engine.modelfile.tokenizer import load_tokenizer
    model = fixture_path()
    assert model.is_file(), f"{model} is missing: `make fixture` fetches it (`make test` does so first)"
    tokenizer = load_tokenizer(str(model))
    return tokenizer, GrammarTokenizer(tokenizer, tokenizer.vocab_size).lltokenizer


def accepts(vocab, grammar: str, text: str) -> bool:
    tokenizer, lltokenizer = vocab
    matcher = llguidance.LLMatcher(lltokenizer, grammar, log_level=0)
    return all(matcher.consume_token(t) for t in tokenizer.encode(text, add_bos=False)) and matcher.is_accepting()


def call(name: str, arguments: dict) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}, separators=(",", ":")) + "\n</tool_call>"


@pytest.mark.parametrize("choice", ["auto", "required"])
def test_the_patch_grammar_holds_a_call_on_the_real_vocabulary(qwen_vocab, choice):
    tools = build_tools([DOCS, PATCH_GRAMMAR])
    assert list(tools.enforced) == ["apply_patch"]
    grammar = tool_grammar(ToolPlan(FORMATS["hermes"], tools.functions, choice, True, tools.enforced), qwen_vocab[0])
    good, other = call("apply_patch", {"input": PATCH}), call("docs__search", {"query": "x"})
    assert accepts(qwen_vocab, grammar, good) and accepts(qwen_vocab, grammar, good + "\n" + other)
    assert not accepts(qwen_vocab, grammar, call("apply_patch", {"input": "fix the bug"}))
    assert not accepts(qwen_vocab, grammar, call("apply_patch", {"input": PATCH.replace("***", "**", 1)}))
    assert not accepts(qwen_vocab, grammar, call("apply_patch", {"input": PATCH, "extra": 1}))
    # under auto, text is free and calls may follow it; forced, the answer is calls only
    assert accepts(qwen_vocab, grammar, "I will fix it.\n" + good) == (choice == "auto")
    assert accepts(qwen_vocab, grammar, "No tool is needed.") == (choice == "auto")
