"""Tool calls in a model's own words: each family writes its calls in a native format, chosen here
from the chat template (as llama.cpp's and vLLM's parsers are), and parsed back into OpenAI's
`tool_calls`, whole or from a stream of text pieces.

    hermes       <tool_call>{"name": ..., "arguments": {...}}</tool_call>   Qwen2.5, Qwen3, Hermes
    qwen3-coder  <tool_call><function=NAME><parameter=P>VALUE</parameter></function></tool_call>
    llama3       {"name": ..., "parameters": {...}} as the whole answer      Llama 3.1 / 3.2 / 3.3
    generic      {"tool_calls": [{"name": ..., "arguments": {...}}]} or {"response": "..."} as the
                 whole answer: for templates with no tool format of their own (the default model's),
                 the tools described in a system message, as llama.cpp's generic handler does

A call is reported once it is whole: the stream holds back the text of a call (and anything that
may still become the opening of one) until it closes, so a client never sees a half-written call;
a call cut off by max_tokens is dropped (the whole calls before it are kept) and the turn ends with
finish_reason "length". Text that looks like a call but does not parse is returned as content,
unchanged.

Small models often skip their format's markers: offered tools, they answer with the bare call,
`{"name": ..., "arguments": {...}}` (or a list of them, or the same in a ```json fence) as the
whole answer. Such an answer is taken as calls when every object names an offered tool and its
arguments fit that tool's parameters schema (jsonschema); otherwise it is content, as before.
"""
from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass

import jsonschema

from serve.reasoning import partial_tag

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str  # JSON text of an object
    id: str

    def openai(self, index: int) -> dict:
        return {"index": index, "id": self.id, "type": "function",
                "function": {"name": self.name, "arguments": self.arguments}}


def new_call(name: str, arguments: dict) -> ToolCall:
    return ToolCall(name, json.dumps(arguments, ensure_ascii=False), f"call_{secrets.token_hex(12)}")


class ToolFormat:
    """One native format: how a call reads (parse) and whether it is delimited in the text (tags
    around each call) or is the whole answer (a JSON object from the first character)."""

    name = ""
    delimited = True

    def parse(self, body: str, strings: dict[str, set[str]] | None = None) -> list[ToolCall] | None:
        """The calls in one delimited call's body (between the tags), or the whole answer's; None if
        it is not a call. strings: per function, its parameters typed "string" in its schema (for
        formats whose values are bare text)."""
        raise NotImplementedError


class Hermes(ToolFormat):
    name = "hermes"

    def parse(self, body: str, strings=None) -> list[ToolCall] | None:
        call = named_call(json_object(body))
        return [new_call(*call)] if call else None


def named_call(obj) -> tuple[str, dict] | None:
    """{"name": ..., "arguments": {...}} (or "parameters", or the arguments as JSON text) -> (name,
    arguments); None if the object is not such a call."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    args = json_object(args) if isinstance(args, str) else args
    return (obj["name"], args) if isinstance(args, dict) else None


class Qwen3Coder(ToolFormat):
    name = "qwen3-coder"
    FUNCTION = re.compile(r"\s*<function=([^>\s]+)>(.*?)</function>\s*", re.S)
    PARAMETER = re.compile(r"<parameter=([^>\s]+)>\n?(.*?)\n?</parameter>", re.S)

    def parse(self, body: str, strings=None) -> list[ToolCall] | None:
        calls, at = [], 0
        for match in self.FUNCTION.finditer(body):
            if body[at:match.start()].strip():
                return None
            text_params = (strings or {}).get(match.group(1), set())
            args = {name: value if name in text_params else parameter_value(value)
                    for name, value in self.PARAMETER.findall(match.group(2))}
            calls.append(new_call(match.group(1), args))
            at = match.end()
        return calls if calls and not body[at:].strip() else None


class Llama3(ToolFormat):
    name = "llama3"
    delimited = False

    def parse(self, body: str, strings=None) -> list[ToolCall] | None:
        obj = json_object(body)
        if obj is None or not isinstance(obj.get("name"), str):
            return None
        args = obj.get("parameters", obj.get("arguments", {}))
        return [new_call(obj["name"], args)] if isinstance(args, dict) else None


class Generic(ToolFormat):
    name = "generic"
    delimited = False

    def parse(self, body: str, strings=None) -> list[ToolCall] | None:
        obj = json_object(body)
        if obj is None:
            return None
        calls = obj.get("tool_calls")
        if not isinstance(calls, list) or not calls:
            return None
        out = []
        for call in calls:
            if not isinstance(call, dict) or not isinstance(call.get("name"), str) or not isinstance(
                    call.get("arguments", {}), dict):
                return None
            out.append(new_call(call["name"], call.get("arguments", {})))
        return out

    @staticmethod
    def response(body: str) -> str | None:
        """The text of a {"response": "..."} answer (the generic format's way of not calling)."""
        obj = json_object(body)
        return obj["response"] if obj is not None and isinstance(obj.get("response"), str) else None


FORMATS = {f.name: f for f in (Hermes(), Qwen3Coder(), Llama3(), Generic())}


def format_for_template(source: str) -> ToolFormat:
    """The format a chat template writes calls in (by the markers its source renders them with)."""
    if CALL_OPEN in source and "<function=" in source and "<parameter=" in source:
        return FORMATS["qwen3-coder"]
    if CALL_OPEN in source:
        return FORMATS["hermes"]
    if "<|python_tag|>" in source or "ipython" in source:
        return FORMATS["llama3"]
    return FORMATS["generic"]


def json_object(text) -> dict | None:
    if isinstance(text, dict):
        return text
    try:
        obj = json.loads(text)
    except (TypeError, ValueError):
        return None
    return obj if isinstance(obj, dict) else None


def parameter_value(text: str):
    """A <parameter> value not typed "string": JSON when it reads as JSON (numbers, booleans,
    objects), else the text."""
    try:
        return json.loads(text)
    except ValueError:
        return text


class ToolCallStream:
    """feed(piece) -> [("content", text) | ("call", ToolCall)]; finish() -> the same, at the end.
    `cut` is set when the output ended inside a call (which is then dropped). tools: the request's
    (OpenAI shape), for their parameters' types."""

    def __init__(self, fmt: ToolFormat, tools: list[dict] | None = None):
        self.fmt = fmt
        self.strings = string_params(tools or [])
        self.schemas = {t["function"]["name"]: t["function"].get("parameters") or {"type": "object"}
                        for t in tools or [] if "function" in t}
        self.gap = ""  # whitespace before the call being read: dropped if it parses
        self.held = ""
        # start: the answer may be a whole-answer call (the format's own, or a bare one): undecided
        self.state = "start" if not fmt.delimited or self.schemas else "text"
        self.cut = False
        self.called = False

    def feed(self, piece: str) -> list[tuple[str, object]]:
        self.held += piece
        out: list[tuple[str, object]] = []
        if self.state == "start":
            stripped = self.held.lstrip()
            if not stripped or may_be_bare_call(stripped):
                return out  # possibly a call: it is decided at the end
            self.state = "text"
        if not self.fmt.delimited:
            out.append(("content", self.held))
            self.held = ""
            return out
        while True:
            if self.state == "text":
                at = self.held.find(CALL_OPEN)
                if at < 0:  # trailing whitespace waits too: before a call it is dropped
                    ready = self.held[: len(self.held) - partial_tag(self.held, CALL_OPEN)].rstrip()
                    if ready:
                        out.append(("content", ready))
                    self.held = self.held[len(ready):]
                    return out
                before = self.held[:at].rstrip()
                if before:
                    out.append(("content", before))
                self.gap, self.held, self.state = self.held[len(before):at], self.held[at:], "call"
            end = self.held.find(CALL_CLOSE)
            if end < 0:
                return out
            whole = self.held[: end + len(CALL_CLOSE)]
            calls = self.fmt.parse(whole[len(CALL_OPEN): end], self.strings)
            out.extend([("call", c) for c in calls] if calls else [("content", self.gap + whole)])
            self.called = self.called or bool(calls)
            self.held, self.state = self.held[end + len(CALL_CLOSE):], "text"

    def finish(self, stopped: bool) -> list[tuple[str, object]]:
        """The output's end; stopped: it ended by itself (not cut off by max_tokens)."""
        held, self.held = self.held, ""
        if self.state == "call":  # cut off inside a call: dropped, never half-reported
            self.cut = True
            return []
        if self.state == "start":
            calls = None
            if stopped:
                calls = (None if self.fmt.delimited else self.fmt.parse(held, self.strings)) or self.bare_calls(held)
            if calls:
                self.called = True
                return [("call", c) for c in calls]
            response = Generic.response(held) if isinstance(self.fmt, Generic) and stopped else None
            return [("content", response if response is not None else held)] if held else []
        if not held or (self.called and not held.strip()):
            return []
        return [("content", held)]


    def bare_calls(self, text: str) -> list[ToolCall] | None:
        """A whole answer that is a bare call (or a list of them), fenced or not: the calls, if each
        names an offered tool with arguments that fit its schema; else None."""
        body = text.strip()
        fenced = FENCE.fullmatch(body)
        try:
            obj = json.loads(fenced.group(1) if fenced else body)
        except ValueError:
            return None
        calls = []
        for item in obj if isinstance(obj, list) else [obj]:
            call = named_call(item)
            if call is None or call[0] not in self.schemas:
                return None
            try:
                jsonschema.validate(call[1], self.schemas[call[0]])
            except (jsonschema.ValidationError, jsonschema.SchemaError):
                return None
            calls.append(new_call(*call))
        return calls or None


FENCE = re.compile(r"```(?:json)?[ \t]*\n(.*?)\n?```", re.S)


def may_be_bare_call(text: str) -> bool:
    """Whether an answer that starts so may still be a bare call: a JSON object or list, or a fence
    that is (or may become) ```json or a bare ``` followed by a new line."""
    return text[0] in "{[" or "```json".startswith(text[:7]) or text.startswith("```\n")


def string_params(tools: list[dict]) -> dict[str, set[str]]:
    out = {}
    for tool in tools:
        fn = tool.get("function", {})
        props = (fn.get("parameters") or {}).get("properties") or {}
        out[fn.get("name", "")] = {k for k, v in props.items() if isinstance(v, dict) and v.get("type") == "string"}
    return out


def parse_all(fmt: ToolFormat, text: str, stopped: bool, tools: list[dict] | None = None) -> tuple[str, list[ToolCall], bool]:
    """A whole output -> (content, calls, cut)."""
    stream = ToolCallStream(fmt, tools)
    events = stream.feed(text) + stream.finish(stopped)
    content = "".join(v for kind, v in events if kind == "content")
    return content, [v for kind, v in events if kind == "call"], stream.cut
