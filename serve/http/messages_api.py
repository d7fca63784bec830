"""/v1/messages (Anthropic's Messages API) over the same path as /v1/chat/completions: the request
becomes the chat request it means (system, system items given mid-conversation, turns, tool_use and
tool_result blocks, documents and search results as text, images as placeholders, tools and
tool_choice), runs through the same template, scheduler, preemption and limits, and the model's
text comes back as Anthropic content blocks (thinking, text, tool_use), whole or as the stream of
message / content-block events with input_json_delta for the calls' input."""
from __future__ import annotations

import functools
import hashlib
import json
import logging
import re
from typing import AsyncIterator

from fastapi import Request as HTTPRequest
from fastapi.responses import JSONResponse, Response, StreamingResponse

from serve.api import anthropic_schema as schema
from serve.api import openai_schema as oai
from serve.api.chat import ChatOutput, reasoning_opened, render, tool_plan
from serve.api.constraints import grammar_for
from serve.api.errors import APIError
from serve.scheduling.generation import Finished, GenerationError, KeepAlive
from serve.api.prompt_fit import PromptFit
from serve.api.prompt_tokens import off_loop, text_tokens
from serve.api.reasoning import CONTENT, REASONING
from serve.http.run_request import build_request, collect, deltas, session_of, until_disconnect
from serve.http.sse import named_event as event

STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}
# a line a well-known coding agent puts at the top of its system prompt, different in every request
# (`x-anthropic-billing-header: cc_version=...; cch=...;`): left in, it would defeat the prefix cache
VOLATILE_PREFIXES = ("x-anthropic-billing-header:",)

log = logging.getLogger("strata.messages")


def stable_system(text: str) -> str:
    """The system prompt without the lines that change from request to request and mean nothing to
    the model, so that an agent's requests share their long prefix in the engine's cache."""
    if not text.lstrip().lower().startswith(VOLATILE_PREFIXES):
        return text
    lines = text.splitlines(keepends=True)
    return "".join(line for line in lines if not line.lstrip().lower().startswith(VOLATILE_PREFIXES))


IMAGE_PLACEHOLDER = "[image omitted: this model reads text only]"
MID_SYSTEM_PROBE = "strata-probe: an instruction given mid-conversation"


class BlockReader:
    """Content blocks -> the text the model reads. An image becomes a placeholder the model sees rather
    than a 400: an agent's history keeps the image (a screenshot, a file its Read tool returned), so a
    refusal would fail every later turn and end its session. What was replaced is noted (`omitted`),
    for one warning a request."""

    def __init__(self):
        self.omitted: list[str] = []

    def text(self, blocks: list, where: str, from_tool: bool = False) -> str:
        """The blocks' text, structural blocks (tool_use, tool_result, thinking) left to the turn."""
        pieces = [self.piece(b, f"{where}[{j}]", from_tool) for j, b in enumerate(blocks)]
        return joined([p for p in pieces if p is not None])

    def piece(self, block, where: str, from_tool: bool) -> tuple[str, bool] | None:
        """(its text, whether it stands on lines of its own), or None for a structural block."""
        if isinstance(block, schema.TextBlock):
            return block.text, False
        if isinstance(block, schema.ImageBlock):
            self.omitted.append(f"{where} (image)")
            return IMAGE_PLACEHOLDER, True
        if isinstance(block, schema.DocumentBlock):
            return self.document(block, where, from_tool), True
        if isinstance(block, schema.OtherBlock):
            raise APIError(400, f"{where}: Strata does not support '{block.type}' content blocks", param=param(where))
        read = getattr(block, "as_text", None)  # search results, tool references, server tools' history
        return (read(), True) if read else None

    def document(self, block: schema.DocumentBlock, where: str, from_tool: bool) -> str:
        """A document's text. One that is not text (a PDF, a URL, a file id) is refused when the client
        put it in the turn (it can send the text instead); in a tool's result, where the agent cannot
        take it back, it becomes a placeholder, as an image does."""
        source = block.source
        if source.type == "content" and source.content is not None:
            inner = source.content if isinstance(source.content, list) else [schema.TextBlock(type="text",
                                                                                          text=source.content)]
            return block.framed(self.text(inner, f"{where}.source.content", from_tool))
        text = source.plain_text()
        if text is not None:
            return block.framed(text)
        why = f"a document block with a {source.described()} source, which this server cannot read (it reads text " \
              f"only: no PDF reader, no fetching of URLs or files)"
        if not from_tool:
            raise APIError(400, f"{where}: {why}; send the document's text instead (a text source)", param=param(where))
        self.omitted.append(f"{where} (document, {source.described()} source)")
        return block.framed(f"[document omitted: {source.described()} source; this model reads text only]")


def joined(pieces: list[tuple[str, bool]]) -> str:
    """Text blocks joined as they come (as the chat path joins text parts); a stand-in (a placeholder, a
    document, a search result) set apart by a blank line, so that it does not run into the words beside it."""
    out, apart = "", False
    for text, own_line in pieces:
        if out and (own_line or apart):
            out = out.rstrip("\n") + "\n\n"
        out, apart = out + text, own_line
    return out


def param(where: str) -> str:
    """messages[3].content[1] -> messages.3.content.1 (an error's param, as the validation errors write it)."""
    return re.sub(r"\[(\d+)\]", r".\1", where)


def system_text(system: str | list[schema.TextBlock], where: str) -> str:
    """A system prompt's or system item's text (text blocks only), less the lines that change per request."""
    if isinstance(system, str):
        return stable_system(system)
    for j, b in enumerate(system):
        if not isinstance(b, schema.TextBlock):
            raise APIError(400, f"{where}[{j}]: a system message holds text blocks only, not '{b.type}'",
                           param=param(f"{where}[{j}]"))
    return "".join(stable_system(b.text) for b in system)


def user_messages(turn: schema.Message, where: str, reader: BlockReader) -> tuple[list[dict], list[dict]]:
    """A user turn as chat messages: (its tool results, as tool messages; its text, as a user message)."""
    blocks = turn.blocks()
    results = [(j, b) for j, b in enumerate(blocks) if isinstance(b, schema.ToolResultBlock)]
    tools = [{"role": "tool", "tool_call_id": b.tool_use_id,
              "content": tool_result_text(b, f"{where}.content[{j}]", reader)} for j, b in results]
    text = reader.text(blocks, f"{where}.content")
    return tools, ([{"role": "user", "content": text}] if text or not results else [])


def tool_result_text(block: schema.ToolResultBlock, where: str, reader: BlockReader) -> str:
    content = block.content
    body = content if isinstance(content, str) else reader.text(content, f"{where}.content", from_tool=True)
    return f"Error: {body}" if block.is_error else body


def assistant_message(turn: schema.Message, where: str, reader: BlockReader) -> dict:
    """An assistant turn: its text, its tool_use blocks as tool_calls; its thinking is not replayed."""
    blocks = turn.blocks()
    calls = [{"id": b.id, "type": "function", "function": {"name": b.name, "arguments": json.dumps(b.input)}}
             for b in blocks if isinstance(b, schema.ToolUseBlock)]
    text = reader.text(blocks, f"{where}.content")
    return {"role": "assistant", "content": text} | ({"tool_calls": calls} if calls else {})


def conversation(body: schema.CountTokensRequest, reader: BlockReader) -> list[dict]:
    """The chat messages an Anthropic conversation means. A system item stays where it was given, after
    the tool results of the turn it precedes (a template reads a call's results right after the call)."""
    messages: list[dict] = []
    if body.system and (system := system_text(body.system, "system")):
        messages.append({"role": "system", "content": system})
    pending: list[dict] = []  # system items given since the last turn
    for i, turn in enumerate(body.messages):
        where = f"messages[{i}]"
        if turn.role == "system":
            text = system_text(turn.content, f"{where}.content")
            pending += [{"role": "system", "content": text}] if text else []
        elif turn.role == "user":
            tools, user = user_messages(turn, where, reader)
            messages += tools + pending + user
            pending = []
        else:
            messages += pending + [assistant_message(turn, where, reader)]
            pending = []
    return messages + pending


@functools.lru_cache(maxsize=8)
def renders_mid_system(template) -> bool:
    """Whether a chat template renders a system message given after the conversation began (ChatML ones,
    Qwen's, Llama 3's do; others raise, or drop it without a word). Probed once a template."""
    probe = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"},
             {"role": "system", "content": MID_SYSTEM_PROBE}, {"role": "user", "content": "Go on"}]
    try:
        return MID_SYSTEM_PROBE in template.render(probe)
    except ValueError:
        return False


def placed_systems(messages: list[dict], mid_system: bool) -> list[dict]:
    """System messages where the template reads them: adjacent ones as one; the leading one is the
    system prompt; a later one stays in place if the template renders it there (mid_system), else it
    is folded, marked as the system's, into the user turn or tool result beside it (the same place in
    the conversation, and the cached prefix before it unchanged), else into the system prompt."""
    out: list[dict] = []
    for m in messages:
        if m["role"] == "system" and out and out[-1]["role"] == "system":
            out[-1] = out[-1] | {"content": out[-1]["content"] + "\n\n" + m["content"]}
        else:
            out.append(dict(m))
    if mid_system:
        return out
    i = 1
    while i < len(out):
        if out[i]["role"] == "system":
            i += fold_system(out, i)
        else:
            i += 1
    return out


def fold_system(out: list[dict], i: int) -> int:
    """Folds the system message out[i] into a neighbour; returns how far the caller moves on (0: the
    next message is now at i)."""
    note = out.pop(i)["content"]
    marked = f"<system>\n{note}\n</system>"
    if i < len(out) and out[i]["role"] == "user":
        out[i]["content"] = marked + ("\n\n" + out[i]["content"] if out[i]["content"] else "")
    elif out[i - 1]["role"] in ("user", "tool"):
        out[i - 1]["content"] = (out[i - 1]["content"] + "\n\n" if out[i - 1]["content"] else "") + marked
    elif out[0]["role"] == "system":
        out[0]["content"] += "\n\n" + note
    else:
        out.insert(0, {"role": "system", "content": note})
        return 1
    return 0


def checked_tools(tools: list[schema.ToolDef]) -> list[dict]:
    """The tools as chat functions. A tool without input_schema is one Anthropic's servers define and run
    (web search, code execution, its bash or text editor): refused by name, as no model here runs it."""
    for i, t in enumerate(tools):
        if t.input_schema is None:
            raise APIError(400, f"tools[{i}]: '{t.type or t.name}' is a tool Anthropic defines or runs on its servers, "
                                f"which Strata does not; give it an input_schema to offer it as a client tool",
                           param=f"tools.{i}")
    return [{"type": "function", "function": {"name": t.name, "description": t.description,
                                              "parameters": t.input_schema}} for t in tools]


def chat_request(body: schema.CountTokensRequest,
                 mid_system: bool = True) -> tuple[oai.ChatCompletionRequest, list[str]]:
    """The chat request an Anthropic one means, and where it had blocks the model cannot read (replaced
    by placeholders). mid_system: whether the template renders a system message mid-conversation."""
    reader = BlockReader()
    fields: dict = {"messages": placed_systems(conversation(body, reader), mid_system)}
    if body.tools:
        fields["tools"] = checked_tools(body.tools)
    choice = body.tool_choice
    if choice is not None:
        fields["tool_choice"] = {"auto": "auto", "any": "required", "none": "none"}.get(
            choice.type, {"type": "function", "function": {"name": choice.name or ""}})
        fields["parallel_tool_calls"] = not choice.disable_parallel_tool_use
    if body.thinking is not None:
        fields["chat_template_kwargs"] = {"enable_thinking": body.thinking.type != "disabled"}
    if isinstance(body, schema.MessagesRequest):
        fields |= {"max_tokens": body.max_tokens, "temperature": body.temperature, "top_p": body.top_p,
                   "top_k": body.top_k, "stop": body.stop_sequences or None, "stream": body.stream}
    return oai.ChatCompletionRequest.model_validate(fields), reader.omitted


def prepared(state, body: schema.CountTokensRequest):
    """(the chat request, its tool plan, the prompt text, the blocks replaced by placeholders)."""
    chat, omitted = chat_request(body, renders_mid_system(state.tokenizer.template))
    plan = tool_plan(state, chat)
    return chat, plan, render(state, chat, plan), omitted


def warn_omitted(omitted: list[str]) -> None:
    """Once a request: the model did not see some blocks (the user learns why an answer ignores them)."""
    if omitted:
        shown = ", ".join(omitted[:5]) + (f" and {len(omitted) - 5} more" if len(omitted) > 5 else "")
        log.warning("/v1/messages: %d block(s) replaced by a placeholder, as this model reads text only: %s",
                    len(omitted), shown)


def count_tokens(state, body: schema.CountTokensRequest) -> dict:
    _, _, text, _ = prepared(state, body)
    return {"input_tokens": state.tokenizer.count(text)}


def signature(thinking: str) -> str:
    """A thinking block's signature: clients (Claude Code) keep it and send the block back with it. Here
    it names the text (a hash); earlier thinking is not replayed to the model either way."""
    return "strata-" + hashlib.blake2b(thinking.encode(), digest_size=16).hexdigest()


def blocks_of(message: dict) -> list[dict]:
    """A chat message's fields as Anthropic content blocks."""
    out = []
    if message.get(REASONING):
        out.append({"type": "thinking", "thinking": message[REASONING], "signature": signature(message[REASONING])})
    if message.get(CONTENT):
        out.append({"type": "text", "text": message[CONTENT]})
    for call in message.get("tool_calls") or []:
        out.append({"type": "tool_use", "id": call["id"], "name": call["function"]["name"],
                    "input": json.loads(call["function"]["arguments"])})
    return out


async def respond(http: HTTPRequest, state, body: schema.MessagesRequest, fit: PromptFit) -> Response:
    chat, plan, text, omitted = await off_loop(prepared, state, body)
    prompt = await off_loop(text_tokens, state, fit, text)
    warn_omitted(omitted)
    user = (body.metadata or {}).get("user_id")
    req = build_request(state, chat, prompt, body.max_tokens, grammar_for(state, plan, chat),
                        session_of(http, user if isinstance(user, str) else None))
    opened, mid, model = reasoning_opened(state, text), f"msg_{req.id:024d}", body.model or state.settings.model_name
    if not body.stream:
        async def work():
            try:
                out, fin = await collect(state, req)
            except GenerationError as e:
                return error_response(e.status, str(e))
            output = ChatOutput(opened, plan)
            message = output.message(out, fin.finish_reason)
            reason = stop_reason(output, fin)
            return JSONResponse(schema.message_body(mid, model, blocks_of(message), reason, fin.prompt_tokens,
                                                    fin.completion_tokens, fin.stop_sequence, fin.cached_tokens))

        return await until_disconnect(http, work())
    return StreamingResponse(stream(state, req, ChatOutput(opened, plan), mid, model),
                             media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


def stop_reason(output: ChatOutput, fin: Finished) -> str:
    if fin.stop_sequence is not None and not output.calls:
        return "stop_sequence"
    return STOP_REASONS[output.finish_reason(fin.finish_reason)]


def error_response(status: int, message: str) -> JSONResponse:
    return JSONResponse(schema.error_body(message, schema.error_type(status)), status_code=status)


class BlockStream:
    """Chat deltas -> content block events: a block opens when a delta of another kind arrives
    (thinking, text, or a tool_use per call) and closes before the next one opens."""

    def __init__(self):
        self.index, self.kind = -1, None
        self.thinking = ""  # the open thinking block's text, for its signature

    def feed(self, delta: dict) -> list[str]:
        out = []
        if REASONING in delta:
            out += self.open("thinking", {"type": "thinking", "thinking": ""})
            out.append(self.delta({"type": "thinking_delta", "thinking": delta[REASONING]}))
            self.thinking += delta[REASONING]
        if delta.get(CONTENT):
            out += self.open("text", {"type": "text", "text": ""})
            out.append(self.delta({"type": "text_delta", "text": delta[CONTENT]}))
        for call in delta.get("tool_calls") or []:
            if "id" in call:  # a call's head: its block opens
                out += self.open("tool_use", {"type": "tool_use", "id": call["id"], "name": call["function"]["name"],
                                              "input": {}}, force=True)
            elif call["function"]["arguments"]:
                out.append(self.delta({"type": "input_json_delta", "partial_json": call["function"]["arguments"]}))
        return out

    def open(self, kind: str, block: dict, force: bool = False) -> list[str]:
        if self.kind == kind and not force:
            return []
        out = self.close()
        self.index, self.kind = self.index + 1, kind
        return out + [event("content_block_start", {"type": "content_block_start", "index": self.index,
                                                    "content_block": block})]

    def close(self) -> list[str]:
        if self.kind is None:
            return []
        out = []
        if self.kind == "thinking":  # the SDK expects a signature before a thinking block ends
            out.append(self.delta({"type": "signature_delta", "signature": signature(self.thinking)}))
            self.thinking = ""
        self.kind = None
        return out + [event("content_block_stop", {"type": "content_block_stop", "index": self.index})]

    def delta(self, d: dict) -> str:
        return event("content_block_delta", {"type": "content_block_delta", "index": self.index, "delta": d})


async def stream(state, req, output: ChatOutput, mid: str, model: str) -> AsyncIterator[str]:
    blocks = BlockStream()
    yield event("message_start", {"type": "message_start", "message": schema.message_body(
        mid, model, [], None, len(req.prompt), 0)})
    yield event("ping", {"type": "ping"})  # at once, as Anthropic's API does; then every keepalive while it waits
    try:
        async for ev in deltas(state, req, output):
            if isinstance(ev, KeepAlive):
                yield event("ping", {"type": "ping"})
            elif isinstance(ev, dict):
                for line in blocks.feed(ev):
                    yield line
            elif isinstance(ev, Finished):
                for line in blocks.close():
                    yield line
                yield event("message_delta", {"type": "message_delta",
                                              "delta": {"stop_reason": stop_reason(output, ev),
                                                        "stop_sequence": ev.stop_sequence},
                                              "usage": schema.usage(ev.prompt_tokens, ev.completion_tokens,
                                                                    ev.cached_tokens)})
                yield event("message_stop", {"type": "message_stop"})
                return
    except GenerationError as e:
        yield event("error", schema.error_body(str(e), schema.error_type(e.status)))
