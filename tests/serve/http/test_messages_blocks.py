"""/v1/messages with what Claude Code and the Anthropic SDK send beyond text and tools: system items
inside `messages`, image, document and search_result blocks, cache_control on every block, thinking
blocks sent back, a history begun on Anthropic's servers (server_tool_use, web_search_tool_result),
and the blocks refused by name. Over an echo engine (its answer is the prompt the template rendered,
so where every block went can be read) on the default model's template and on one that takes only a
leading system message; then on the real default model, through the anthropic client."""
from __future__ import annotations

import base64
import re
import subprocess
import sys

import anthropic
import pytest

from engine.modelfile.tokenizer import ChatTemplate
from serve.http.messages_api import IMAGE_PLACEHOLDER, renders_mid_system
from tests.harness import ROOT, ServerProcess, mock_engine_cmd

# echo the prompt; the default vocabulary's <|endoftext|> (0) is in no prompt, unlike <|im_end|> (2)
ECHO = mock_engine_cmd("--eos", "0", "--chunk-s", "0.001", "--token-s", "0.0005")
TEMPLATES = ROOT / "tests/fixtures/templates"
# a ChatML template that, as several families' do, refuses a system message anywhere but first
LEADING_ONLY = ("{% for m in messages %}{% if m['role'] == 'system' and not loop.first %}"
                "{{ raise_exception('a system message may only come first') }}{% endif %}"
                "<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
# one that renders a leading system message and drops any later one without a word
DROPS_LATER = ("{% for m in messages %}{% if m['role'] != 'system' or loop.first %}"
               "<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endif %}{% endfor %}"
               "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
# a 1x1 PNG: never decoded, only replaced
PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
EPHEMERAL = {"type": "ephemeral"}
SCREENSHOT = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG},
              "cache_control": EPHEMERAL}
READ = {"name": "Read", "description": "Read a file", "cache_control": EPHEMERAL,
        "input_schema": {"type": "object", "properties": {"file_path": {"type": "string"}},
                         "required": ["file_path"]}}
# a Claude Code turn: instructions given mid-conversation as system items, one of them between a tool
# call and the turn that carries its result
WITH_SYSTEM_ITEMS = [
    {"role": "system", "content": "Lead instructions."},
    {"role": "user", "content": "Fix the bug."},
    {"role": "assistant", "content": [{"type": "text", "text": "Reading it."},
                                      {"type": "tool_use", "id": "toolu_1", "name": "Read",
                                       "input": {"file_path": "a.py"}}]},
    {"role": "system", "content": "Plan mode is on: do not edit files."},
    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "print('hi')"}]},
    {"role": "assistant", "content": "It prints hi."},
    {"role": "system", "content": [{"type": "text", "text": "Reminder: be terse.", "cache_control": EPHEMERAL}]},
    {"role": "user", "content": "Thanks"}]


def synthetic_model(folder, template: str):
    (folder / "template.jinja").write_text(template)
    path = folder / "model.gguf"
    subprocess.run([sys.executable, str(ROOT / "tools/fixtures/make_synthetic_gguf.py"), str(path), "--layers", "1",
                    "--dim", "64", "--ffn", "64", "--heads", "1", "--kv-heads", "1", "--ctx", "2048", "--type", "F32",
                    "--chat-template", str(folder / "template.jinja")], check=True, capture_output=True)
    return path


@pytest.fixture(scope="module")
def echo():
    """An echo engine behind the default model's template (SmolLM2's ChatML)."""
    with ServerProcess(engine_cmd=ECHO) as server:
        yield server


@pytest.fixture(scope="module")
def leading_only(tmp_path_factory):
    path = synthetic_model(tmp_path_factory.mktemp("leading_only"), LEADING_ONLY)
    with ServerProcess(engine_cmd=ECHO, extra=["--model", str(path)]) as server:
        yield server


def client_of(server) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0)


def prompt_of(server, **request) -> str:
    """The prompt the server rendered: the echo engine's answer, cut at the prompt's length."""
    client = client_of(server)
    counted = client.messages.count_tokens(model="any", **request).input_tokens
    reply = client.messages.create(model="any", max_tokens=counted, **request)
    assert reply.usage.input_tokens + reply.usage.cache_read_input_tokens == counted
    return reply.content[0].text


def placeholder_warnings(server) -> list[str]:
    return [line for line in server.log().splitlines() if "replaced by a placeholder" in line]


def test_which_templates_render_a_system_message_mid_conversation(tokenizer):
    def template(source: str) -> ChatTemplate:
        return ChatTemplate(source, tokenizer.special)

    assert renders_mid_system(tokenizer.template)  # the default model's ChatML
    for name in ("Qwen-Qwen2.5-7B-Instruct", "Qwen-Qwen3-0.6B", "meta-llama-Llama-3.1-8B-Instruct"):
        assert renders_mid_system(template((TEMPLATES / f"{name}.jinja").read_text())), name
    assert not renders_mid_system(template(LEADING_ONLY)) and not renders_mid_system(template(DROPS_LATER))
    with pytest.raises(ValueError, match="may only come first"):  # what placing them in turn avoids
        template(LEADING_ONLY).render([{"role": "user", "content": "a"}, {"role": "system", "content": "b"}])


def test_system_items_stay_in_place_where_the_template_renders_them(echo):
    prompt = prompt_of(echo, system="Top.", messages=WITH_SYSTEM_ITEMS)
    assert prompt.startswith("system\nTop.\n\nLead instructions.\nuser\nFix the bug.\n")  # one system prompt
    order = ["assistant\nReading it.", "tool\nprint('hi')", "system\nPlan mode is on: do not edit files.",
             "assistant\nIt prints hi.", "system\nReminder: be terse.", "user\nThanks"]
    at = [prompt.index(part) for part in order]
    assert at == sorted(at) and "<system>" not in prompt


def test_system_items_fold_into_the_turn_beside_them_where_only_a_leading_one_renders(leading_only):
    prompt = prompt_of(leading_only, system="Top.", messages=WITH_SYSTEM_ITEMS)
    assert prompt.startswith("system\nTop.\n\nLead instructions.\nuser\nFix the bug.\n")
    assert prompt.splitlines().count("system") == 1  # one system message: the leading one
    # before the assistant's answer to the tool result: appended to it; before a user turn: at its start
    assert "tool\nprint('hi')\n\n<system>\nPlan mode is on: do not edit files.\n</system>\nassistant\nIt prints hi." \
        in prompt
    assert "user\n<system>\nReminder: be terse.\n</system>\n\nThanks\nassistant\n" in prompt


def test_blocks_claude_code_sends_are_read_as_text_and_images_become_placeholders(echo):
    notes = {"type": "document", "title": "notes.txt", "context": "from the user", "citations": {"enabled": True},
             "source": {"type": "text", "media_type": "text/plain", "data": "Line one of the notes."},
             "cache_control": EPHEMERAL}
    result = {"type": "search_result", "source": "https://example.com/a", "title": "Result A",
              "content": [{"type": "text", "text": "Alpha facts."}], "citations": {"enabled": True},
              "cache_control": EPHEMERAL}
    messages = [
        {"role": "user", "content": [
            {"type": "text", "text": "Look at this screenshot:", "cache_control": EPHEMERAL}, SCREENSHOT,
            {"type": "text", "text": "and this document:"}, notes,
            {"type": "document", "source": {"type": "content", "content": [{"type": "text", "text": "Inner text."}]}},
            {"type": "document", "source": {"type": "base64", "media_type": "text/plain",
                                            "data": base64.b64encode(b"Encoded notes.").decode()}},
            result]},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "Secret reasoning.", "signature": "c2ln"},
            {"type": "redacted_thinking", "data": "opaque-bytes"},
            {"type": "text", "text": "Let me read it.", "citations": None},
            {"type": "tool_use", "id": "toolu_1", "name": "Read", "input": {"file_path": "shot.png"},
             "cache_control": EPHEMERAL}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "cache_control": EPHEMERAL, "content": [
                {"type": "text", "text": "Read the image:"},
                {"type": "image", "source": {"type": "url", "url": "https://example.com/shot.png"}}]},
            {"type": "text", "text": "What do you see?"}]}]
    system = [{"type": "text", "text": "You are a coding agent.", "cache_control": EPHEMERAL}]
    before = len(placeholder_warnings(echo))
    prompt = prompt_of(echo, system=system, messages=messages)
    assert (f"user\nLook at this screenshot:\n\n{IMAGE_PLACEHOLDER}\n\nand this document:\n\n"
            "Document: notes.txt\nfrom the user\nLine one of the notes.\n\nInner text.\n\nEncoded notes.\n\n"
            "Search result: Result A\nSource: https://example.com/a\nAlpha facts.\n") in prompt
    assert f"tool\nRead the image:\n\n{IMAGE_PLACEHOLDER}\nuser\nWhat do you see?\n" in prompt
    assert "assistant\nLet me read it.\n" in prompt  # earlier thinking is not replayed
    assert "Secret reasoning" not in prompt and "opaque" not in prompt
    warnings = placeholder_warnings(echo)[before:]  # one a request (count_tokens warns of nothing)
    assert len(warnings) == 1 and "2 block(s)" in warnings[0] and "messages[2].content[0].content[1]" in warnings[0]
    count = client_of(echo).messages.count_tokens
    with_tools = count(model="any", system=system, messages=messages, tools=[READ]).input_tokens
    assert with_tools > count(model="any", system=system, messages=messages).input_tokens  # cache_control on a tool


def test_a_history_begun_on_anthropics_servers_is_read_as_text(echo):
    messages = [
        {"role": "user", "content": "What is Strata?"},
        {"role": "assistant", "content": [
            {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {"query": "strata llm"}},
            {"type": "web_search_tool_result", "tool_use_id": "srvtoolu_1", "content": [
                {"type": "web_search_result", "url": "https://example.com/strata", "title": "Strata docs",
                 "encrypted_content": "EqgfCioIARgBIiQ3", "page_age": "2 days"}]},
            {"type": "text", "text": "A local LLM server."}]},
        {"role": "user", "content": "Thanks"}]
    prompt = prompt_of(echo, messages=messages)
    assert ('assistant\n[web_search: {"query": "strata llm"}]\n\nWeb search results:\n'
            "- Strata docs (https://example.com/strata)\n\nA local LLM server.\n") in prompt
    assert "EqgfCioIARgBIiQ3" not in prompt


def test_blocks_strata_cannot_read_are_refused_by_name_where_the_client_can_take_them_back(echo):
    client = client_of(echo)
    pdf = {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": "JVBERi0xLjQ="}}

    def refused(match: str, **request) -> None:
        request.setdefault("messages", [{"role": "user", "content": "Hi"}])
        with pytest.raises(anthropic.BadRequestError) as e:
            client.messages.create(model="any", max_tokens=5, **request)
        assert e.value.body["error"]["type"] == "invalid_request_error"
        assert re.match(match, e.value.body["error"]["message"]), e.value.body["error"]["message"]

    refused(r"messages\[0\]\.content\[1\]: a document block with a base64 \(application/pdf\) source, which this "
            r"server cannot read .*send the document's text instead",
            messages=[{"role": "user", "content": [{"type": "text", "text": "Summarize:"}, pdf]}])
    refused(r"messages\[0\]\.content\[0\]: a document block with a url source", messages=[{"role": "user", "content": [
        {"type": "document", "source": {"type": "url", "url": "https://example.com/a.pdf"}}]}])
    refused(r"messages\[0\]\.content\[0\]: Strata does not support 'container_upload' content blocks",
            messages=[{"role": "user", "content": [{"type": "container_upload", "file_id": "file_1"}]}])
    refused(r"messages\[1\]\.content\[0\]: Strata does not support 'web_fetch_tool_result' content blocks",
            messages=[{"role": "user", "content": "Fetch it"}, {"role": "assistant", "content": [
                {"type": "web_fetch_tool_result", "tool_use_id": "srvtoolu_1", "content": {}}]},
                {"role": "user", "content": "and?"}])
    refused(r"messages\[1\]\.content\[0\]: a system message holds text blocks only, not 'image'",
            messages=[{"role": "user", "content": "Hi"}, {"role": "system", "content": [SCREENSHOT]}])
    refused(r"tools\[1\]: 'web_search_20250305' is a tool Anthropic defines or runs on its servers",
            tools=[READ, {"type": "web_search_20250305", "name": "web_search", "max_uses": 5}])
    # a PDF a tool returned: the agent cannot take it back (a 400 would fail every later turn)
    prompt = prompt_of(echo, messages=[
        {"role": "user", "content": "Read the spec."},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "Read",
                                           "input": {"file_path": "spec.pdf"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": [pdf]}]}])
    assert "tool\n[document omitted: base64 (application/pdf) source; this model reads text only]\n" in prompt


@pytest.fixture(scope="module")
def real():
    """The real engine on the default model (a text-only one)."""
    with ServerProcess() as server:
        yield server


def test_a_claude_code_session_with_images_goes_on_with_the_real_model(real):
    """Screenshots in a user turn and in a Read tool's result, a system item, thinking sent back: each
    turn is answered, the model reads placeholders, and the user is told (a warning a request)."""
    client = client_of(real)
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "Why does the button look wrong?"}, SCREENSHOT]},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "I should read the CSS.", "signature": "c2ln"},
            {"type": "tool_use", "id": "toolu_1", "name": "Read", "input": {"file_path": "button.png"},
             "cache_control": EPHEMERAL}]},
        {"role": "system", "content": "Answer in one sentence."},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "cache_control": EPHEMERAL,
                                      "content": [{"type": "text", "text": "Image of button.png:"}, SCREENSHOT]}]}]
    system = [{"type": "text", "text": "You are a coding agent.", "cache_control": EPHEMERAL}]
    request = dict(model="any", system=system, tools=[READ], thinking={"type": "enabled", "budget_tokens": 1024},
                   extra_body={"temperature": 0})  # greedy, so stream and whole agree (not an argument in this client)
    counted = client.messages.count_tokens(messages=messages, **request).input_tokens
    no_images = [{"role": "user", "content": "Why does the button look wrong?"}] + messages[1:3] + [
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                      "content": "Image of button.png:"}]}]
    assert client.messages.count_tokens(messages=no_images, **request).input_tokens < counted  # placeholders read

    before = len(placeholder_warnings(real))
    reply = client.messages.create(messages=messages, max_tokens=8, **request)
    assert reply.stop_reason in ("end_turn", "max_tokens", "tool_use") and reply.usage.output_tokens > 0
    assert reply.usage.input_tokens + reply.usage.cache_read_input_tokens == counted
    with client.messages.stream(messages=messages, max_tokens=8, **request) as stream:
        streamed = stream.get_final_message()
    def kinds(message):  # a call's id differs from one answer to the next; what the model wrote does not
        return [(b.type, getattr(b, "text", None), getattr(b, "input", None)) for b in message.content]

    assert kinds(streamed) == kinds(reply)
    warnings = placeholder_warnings(real)[before:]
    assert len(warnings) == 2 and all("2 block(s)" in w for w in warnings)  # one a request

    # the next turn sends the same history again: it is answered too, the session goes on
    messages += [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in reply.content]},
                 {"role": "user", "content": [{"type": "text", "text": "Fix it."}, SCREENSHOT]}]
    again = client.messages.create(messages=messages, max_tokens=8, **request)
    assert again.usage.output_tokens > 0 and "3 block(s)" in placeholder_warnings(real)[-1]
