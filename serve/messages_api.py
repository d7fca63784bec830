"""/v1/messages (Anthropic's Messages API) over the same path as /v1/chat/completions: the request
becomes the chat request it means (system, turns, tool_use and tool_result blocks, tools and
tool_choice), runs through the same template, scheduler, preemption and limits, and the model's
text comes back as Anthropic content blocks (thinking, text, tool_use), whole or as the stream of
message / content-block events with input_json_delta for the calls' input."""
from __future__ import annotations

import hashlib
import json
from typing import AsyncIterator

from fastapi import Request as HTTPRequest
from fastapi.responses import JSONResponse, Response, StreamingResponse

from serve import anthropic_schema as schema
from serve import openai_schema as oai
from serve.chat import ChatOutput, reasoning_opened, render, tool_plan
from serve.constraints import grammar_for
from serve.generation import Finished, GenerationError, KeepAlive
from serve.reasoning import CONTENT, REASONING
from serve.running import build_request, collect, deltas, session_of, until_disconnect
from serve.sse import named_event as event

STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}
# a line a well-known coding agent puts at the top of its system prompt, different in every request
# (`x-anthropic-billing-header: cc_version=...; cch=...;`): left in, it would defeat the prefix cache
VOLATILE_PREFIXES = ("x-anthropic-billing-header:",)


def stable_system(text: str) -> str:
    """The system prompt without the lines that change from request to request and mean nothing to
    the model, so that an agent's requests share their long prefix in the engine's cache."""
    if not text.lstrip().lower().startswith(VOLATILE_PREFIXES):
        return text
    lines = text.splitlines(keepends=True)
    return "".join(line for line in lines if not line.lstrip().lower().startswith(VOLATILE_PREFIXES))


def chat_request(body: schema.CountTokensRequest) -> oai.ChatCompletionRequest:
    """The chat request an Anthropic one means. A user turn's tool_result blocks become tool
    messages (before its text); an assistant turn's tool_use blocks become its tool_calls; thinking
    blocks of earlier turns are not replayed."""
    messages: list[dict] = []
    if body.system:
        blocks = [body.system] if isinstance(body.system, str) else [b.text for b in body.system]
        system = "".join(stable_system(text) for text in blocks)
        if system:
            messages.append({"role": "system", "content": system})
    for turn in body.messages:
        blocks = turn.blocks()
        text = "".join(b.text for b in blocks if isinstance(b, schema.TextBlock))
        if turn.role == "user":
            for b in blocks:
                if isinstance(b, schema.ToolResultBlock):
                    messages.append({"role": "tool", "tool_call_id": b.tool_use_id, "content": b.text()})
            if text or not any(isinstance(b, schema.ToolResultBlock) for b in blocks):
                messages.append({"role": "user", "content": text})
        else:
            calls = [{"id": b.id, "type": "function", "function": {"name": b.name, "arguments": json.dumps(b.input)}}
                     for b in blocks if isinstance(b, schema.ToolUseBlock)]
            messages.append({"role": "assistant", "content": text} | ({"tool_calls": calls} if calls else {}))
    fields: dict = {"messages": messages}
    if body.tools:
        fields["tools"] = [{"type": "function", "function": {"name": t.name, "description": t.description,
                                                             "parameters": t.input_schema}} for t in body.tools]
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
    return oai.ChatCompletionRequest.model_validate(fields)


def prepared(state, body: schema.CountTokensRequest):
    """(the chat request, its tool plan, the prompt text)."""
    chat = chat_request(body)
    plan = tool_plan(state, chat)
    return chat, plan, render(state, chat, plan)


def count_tokens(state, body: schema.CountTokensRequest) -> dict:
    _, _, text = prepared(state, body)
    return {"input_tokens": len(state.tokenizer.encode(text))}


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


async def respond(http: HTTPRequest, state, body: schema.MessagesRequest) -> Response:
    chat, plan, text = prepared(state, body)
    user = (body.metadata or {}).get("user_id")
    req = build_request(state, chat, state.tokenizer.encode(text), body.max_tokens, grammar_for(state, plan, chat),
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
