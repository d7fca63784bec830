"""OpenAI's Responses API (`POST /v1/responses`, streamed and not) over the chat machinery: the
request's instructions, input items and tools become a chat request (serve/api/chat.py renders it
through the model's template, tool calls are parsed in its format), and the answer comes back as
output items: reasoning, a message with output_text, function_call items.

Conversations: `store: false` clients (Codex CLI) send the whole transcript each turn, with their
earlier `function_call` items and the `function_call_output` items answering them; otherwise a
response is kept in memory (the last STORE_SIZE of them) and `previous_response_id` continues it.
"""
from __future__ import annotations

import json
import secrets
import time
from dataclasses import replace
from typing import AsyncIterator

from fastapi import Request as HTTPRequest
from fastapi.responses import JSONResponse, Response, StreamingResponse

from serve.api import openai_schema as oai
from serve.api import responses_schema as schema
from serve.api.chat import ChatOutput, reasoning_opened, tool_plan
from serve.api.constraints import grammar_for
from serve.api.logprobs import chat_logprobs
from serve.api.errors import APIError, server_error
from serve.scheduling.generation import Finished, GenerationError, KeepAlive
from serve.api.prompt_fit import PromptFit
from serve.api.prompt_tokens import chat_tokens, off_loop
from serve.api.reasoning import CONTENT, REASONING
from serve.http.run_request import build_request, collect, deltas, session_of, until_disconnect
from serve.api.response_store import ResponseStore
from serve.api.response_tools import ToolMap, build as build_tools, custom_text, flat_name
from serve.http.sse import named_event

def text_of(content) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return ""


def input_messages(body: schema.ResponsesRequest) -> list[dict]:
    """The request's input items as chat messages: messages by role, consecutive calls (function_call
    and custom_tool_call items) as one assistant turn's tool_calls, their outputs as tool messages;
    reasoning items of earlier turns are not replayed."""
    if isinstance(body.input, str):
        return [{"role": "user", "content": body.input}]
    messages: list[dict] = []
    for i, item in enumerate(body.input):
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "assistant", "system", "developer"):
                raise APIError(400, f"input[{i}]: a message's role must be user, assistant, system or developer",
                               param="input")
            messages.append({"role": role, "content": text_of(item.get("content"))})
        elif kind in ("function_call", "custom_tool_call"):
            last = messages[-1] if messages else None
            if last is None or last["role"] != "assistant" or "tool_calls" not in last:
                last = {"role": "assistant", "content": "", "tool_calls": []}
                messages.append(last)
            last["tool_calls"].append(chat_call(item))
        elif kind in ("function_call_output", "custom_tool_call_output"):
            output = item.get("output")
            messages.append({"role": "tool", "tool_call_id": item.get("call_id"),
                             "content": output if isinstance(output, str) else text_of(output)})
        elif kind == "reasoning":
            continue
        else:
            raise APIError(400, f"input[{i}]: items of type {kind!r} are not supported", param="input")
    return messages


def chat_call(item: dict) -> dict:
    """A function_call or custom_tool_call item as a chat tool call (a custom tool's input as the
    {"input": ...} arguments of its chat function)."""
    if item.get("type") == "custom_tool_call":
        arguments = json.dumps({"input": item.get("input") or ""}, ensure_ascii=False)
    else:
        arguments = item.get("arguments") or "{}"
    return {"id": item.get("call_id") or item.get("id"), "type": "function",
            "function": {"name": flat_name(item.get("name", ""), item.get("namespace")), "arguments": arguments}}


def chat_tool_choice(choice):
    if choice is None or isinstance(choice, str):
        return choice
    if choice.get("type") in ("function", "custom"):
        return {"type": "function", "function": {"name": flat_name(choice.get("name", ""), choice.get("namespace"))}}
    raise APIError(400, f"tool_choice of type {choice.get('type')!r} is not supported", param="tool_choice")


def chat_request(body: schema.ResponsesRequest, history: list[dict], tools: ToolMap) -> oai.ChatCompletionRequest:
    messages = ([{"role": "system", "content": body.instructions}] if body.instructions else []) + history
    messages += input_messages(body)
    fields: dict = {"messages": messages, "max_tokens": body.max_output_tokens, "temperature": body.temperature,
                    "top_p": body.top_p, "stream": body.stream, "parallel_tool_calls": body.parallel_tool_calls,
                    "priority": body.priority}
    if body.logprobs:
        fields |= {"logprobs": True, "top_logprobs": body.top_logprobs or 0}
    if tools.functions:
        fields["tools"] = tools.functions
    if body.tool_choice is not None:
        fields["tool_choice"] = chat_tool_choice(body.tool_choice)
    fmt = (body.text or {}).get("format")
    if fmt and fmt.get("type") in ("json_object", "json_schema"):
        fields["response_format"] = {"type": fmt["type"]} | (
            {"json_schema": {"name": fmt.get("name", "response"), "schema": fmt.get("schema"), "strict": fmt.get("strict")}}
            if fmt["type"] == "json_schema" else {})
    try:
        return oai.ChatCompletionRequest.model_validate(fields)
    except ValueError as e:
        raise APIError(400, f"the request cannot be served: {e}") from None


def output_items(message: dict, ids: "ItemIds", tools: ToolMap, logprobs: list[dict] | None = None) -> list[dict]:
    """A whole answer's chat message fields as Responses output items (logprobs: the answer's tokens',
    given with its text)."""
    out = []
    if message.get(REASONING):
        out.append(schema.reasoning_item(ids.new("rs"), message[REASONING]))
    if message.get(CONTENT):
        out.append(schema.message_item(ids.new("msg"), message[CONTENT], logprobs=logprobs))
    for call in message.get("tool_calls") or []:
        out.append(schema.call_item(ids.new("fc"), tools.item(call["id"], call["function"]["name"],
                                                              call["function"]["arguments"])))
    return out


class ItemIds:
    def __init__(self, rid: str):
        self.base, self.count = rid.removeprefix("resp_"), 0

    def new(self, prefix: str) -> str:
        self.count += 1
        return f"{prefix}_{self.base}{self.count:04d}"


def status_of(output: ChatOutput, fin: Finished) -> tuple[str, str | None]:
    reason = output.finish_reason(fin.finish_reason)
    return ("incomplete", "max_output_tokens") if reason == "length" else ("completed", None)


def conversation(chat: oai.ChatCompletionRequest, items: list[dict]) -> list[dict]:
    """What a later previous_response_id continues: this turn's messages (instructions are not
    carried over) and its answer, from its output items."""
    text = "".join(part["text"] for item in items if item["type"] == "message" for part in item["content"])
    calls = [chat_call(item) for item in items if item["type"] in ("function_call", "custom_tool_call")]
    answer = {"role": "assistant", "content": text} | ({"tool_calls": calls} if calls else {})
    return [m.model_dump(exclude_none=True) for m in chat.messages if m.role != "system"] + [answer]


async def respond(http: HTTPRequest, state, store: ResponseStore, body: schema.ResponsesRequest,
                  fit: PromptFit) -> Response:
    history = store.get(body.previous_response_id) if body.previous_response_id else []
    tools = build_tools(body.tools)
    chat = chat_request(body, history, tools)
    plan = replace(tool_plan(state, chat), enforced=tools.enforced)
    text, prompt = await off_loop(chat_tokens, state, fit, chat, plan)
    req = build_request(state, chat, prompt, body.max_output_tokens, grammar_for(state, plan, chat),
                        session_of(http, body.prompt_cache_key))
    rid, model = f"resp_{secrets.token_hex(12)}", body.model or state.settings.model_name
    opened = reasoning_opened(state, text)
    if not body.stream:
        async def work():
            try:
                out, fin = await collect(state, req)
            except GenerationError as e:
                return server_error(e.status, str(e)).response()
            output = ChatOutput(opened, plan)
            message = output.message(out, fin.finish_reason)
            status, incomplete = status_of(output, fin)
            items = output_items(message, ItemIds(rid), tools,
                                 chat_logprobs(state.tokenizer, fin.logprobs)["content"] if body.logprobs else None)
            if body.store:
                store.put(rid, conversation(chat, items))
            return JSONResponse(schema.response_object(
                rid, model, body, items, status,
                schema.usage(fin.prompt_tokens, fin.completion_tokens, fin.cached_tokens), incomplete))

        return await until_disconnect(http, work())
    scores = (lambda tokens: chat_logprobs(state.tokenizer, tokens)["content"]) if body.logprobs else None
    return StreamingResponse(stream(state, store, req, body, chat, ChatOutput(opened, plan),
                                    ItemStream(rid, tools, scores), model),
                             media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


class ItemStream:
    """Chat deltas -> Responses stream events: an output item opens when a delta of another kind
    arrives (reasoning, text, or a function call) and is done before the next one opens."""

    def __init__(self, rid: str, tools: ToolMap, scores=None):
        """scores: the answer's tokens (T lines) -> their logprobs entries, when the request asked."""
        self.ids, self.items, self.open_item, self.seq = ItemIds(rid), [], None, 0
        self.rid, self.tools, self.text, self.scores, self.scored = rid, tools, "", scores, []

    def event(self, kind: str, data: dict) -> str:
        self.seq += 1
        return named_event(kind, {"type": kind, "sequence_number": self.seq} | data)

    def feed(self, delta: dict) -> list[str]:
        out = []
        if delta.get(REASONING):
            out += self.start("reasoning")
            out.append(self.event("response.reasoning_text.delta", self.where() | {"delta": delta[REASONING]}))
            self.text += delta[REASONING]
        if delta.get(CONTENT):
            out += self.start("message")
            scored = self.scores(delta.get("logprobs", [])) if self.scores else None
            out.append(self.event("response.output_text.delta", self.where() | {"delta": delta[CONTENT]}
                                  | ({"logprobs": scored} if scored is not None else {})))
            self.text += delta[CONTENT]
            self.scored += scored or []
        for call in delta.get("tool_calls") or []:
            if "id" in call:
                out += self.start("call", call)
            arguments = call["function"].get("arguments")
            if arguments:  # a whole call's arguments (calls are reported once they are whole)
                at = {"item_id": self.open_item["id"], "output_index": len(self.items)}
                if self.open_item["type"] == "custom_tool_call":
                    out.append(self.event("response.custom_tool_call_input.delta", at | {"delta": custom_text(arguments)}))
                else:
                    out.append(self.event("response.function_call_arguments.delta", at | {"delta": arguments}))
                self.text += arguments
        return out

    def where(self) -> dict:
        return {"item_id": self.open_item["id"], "output_index": len(self.items), "content_index": 0}

    def start(self, kind: str, call: dict | None = None) -> list[str]:
        if self.open_item is not None and self.open_item["type"] == kind and call is None:
            return []
        out = self.done()
        if kind == "reasoning":
            self.open_item = {"type": "reasoning", "id": self.ids.new("rs"), "summary": [], "content": []}
        elif kind == "message":
            self.open_item = schema.message_item(self.ids.new("msg"), "", status="in_progress")
        else:
            self.open_item = schema.call_item(self.ids.new("fc"), self.tools.item(call["id"], call["function"]["name"], ""),
                                              status="in_progress")
        out.append(self.event("response.output_item.added", {"output_index": len(self.items), "item": self.open_item}))
        if kind == "message":
            out.append(self.event("response.content_part.added", self.where() | {"part": schema.output_text("")}))
        return out

    def done(self) -> list[str]:
        item, self.open_item = self.open_item, None
        if item is None:
            return []
        at, text, self.text = {"item_id": item["id"], "output_index": len(self.items)}, self.text, ""
        out = []
        if item["type"] == "message":
            item = schema.message_item(item["id"], text, logprobs=self.scored if self.scores else None)
            self.scored = []
            out.append(self.event("response.output_text.done", at | {"content_index": 0, "text": text}))
            out.append(self.event("response.content_part.done", at | {"content_index": 0, "part": item["content"][0]}))
        elif item["type"] == "reasoning":
            item = schema.reasoning_item(item["id"], text)
            out.append(self.event("response.reasoning_text.done", at | {"content_index": 0, "text": text}))
        elif item["type"] == "custom_tool_call":
            item = item | {"input": custom_text(text), "status": "completed"}
            out.append(self.event("response.custom_tool_call_input.done", at | {"input": item["input"]}))
        else:
            item = item | {"arguments": text, "status": "completed"}
            out.append(self.event("response.function_call_arguments.done", at | {"arguments": text}))
        self.items.append(item)
        return out + [self.event("response.output_item.done", {"output_index": len(self.items) - 1, "item": item})]


async def stream(state, store: ResponseStore, req, body: schema.ResponsesRequest, chat, output: ChatOutput,
                 items: ItemStream, model: str) -> AsyncIterator[str]:
    rid, created = items.rid, int(time.time())
    start = schema.response_object(rid, model, body, [], "in_progress", created=created)
    yield items.event("response.created", {"response": start})
    yield items.event("response.in_progress", {"response": start})
    try:
        async for ev in deltas(state, req, output):
            if isinstance(ev, KeepAlive):
                yield ": keep-alive\n\n"
            elif isinstance(ev, dict):
                for line in items.feed(ev):
                    yield line
            elif isinstance(ev, Finished):
                for line in items.done():
                    yield line
                status, incomplete = status_of(output, ev)
                if body.store:
                    store.put(rid, conversation(chat, items.items))
                final = schema.response_object(rid, model, body, items.items, status,
                                               schema.usage(ev.prompt_tokens, ev.completion_tokens, ev.cached_tokens),
                                               incomplete, created)
                kind = "response.completed" if status == "completed" else "response.incomplete"
                yield items.event(kind, {"response": final})
                return
    except GenerationError as e:
        yield items.event("error", {"code": "server_error", "message": str(e), "param": None})
