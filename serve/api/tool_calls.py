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


from serve.api.reasoning import partial_tag

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

    @staticmethod
    def partial_response(body: str) -> str | None:
        """The text so far of a {"response": "... answer cut off by max_tokens (a half-written escape
        dropped); None if the answer is not one."""
        opened = RESPONSE_OPEN.match(body)
        if opened is None:
            return None
        rest = body[opened.end():]
        for trim in range(min(len(rest), 6) + 1):  # an escape is at most 6 characters (\uXXXX)
            try:
                return json.loads('"' + rest[: len(rest) - trim] + '"')
            except ValueError:
                continue
        return None


RESPONSE_OPEN = re.compile(r'\s*\{\s*"response"\s*:\s*"')


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
                at, kind = self.opening()
                if at < 0:  # trailing whitespace waits too: before a call it is dropped
                    ready = self.held[: len(self.held) - self.partial_opening()].rstrip()
                    if ready:
                        out.append(("content", ready))
                    self.held = self.held[len(ready):]
                    return out
                before = self.held[:at].rstrip()
                if before:
                    out.append(("content", before))
                self.gap, self.held, self.state = self.held[len(before):at], self.held[at:], kind
            if self.state == "fence":  # a fenced block after text: a bare call, or text as it was
                end = self.held.find(FENCE_MARK, len(FENCE_MARK))
                if end < 0:
                    return out
                whole = self.held[: end + len(FENCE_MARK)]
                calls = self.bare_calls(whole)
            else:
                end = self.held.find(CALL_CLOSE)
                if end < 0:
                    return out
                whole = self.held[: end + len(CALL_CLOSE)]
                calls = self.fmt.parse(whole[len(CALL_OPEN): end], self.strings)
            out.extend([("call", c) for c in calls] if calls else [("content", self.gap + whole)])
            self.called = self.called or bool(calls)
            self.held, self.state = self.held[len(whole):], "text"

    def opening(self) -> tuple[int, str]:
        """Where the next call may open in the held text, and how: the format's marker ("call") or,
        when tools were offered, a ``` fence that may hold a bare call ("fence"); -1 if nowhere."""
        found = [(at, kind) for at, kind in ((self.held.find(CALL_OPEN), "call"),
                                             (self.held.find(FENCE_MARK) if self.schemas else -1, "fence")) if at >= 0]
        return min(found) if found else (-1, "")

    def partial_opening(self) -> int:
        return max(partial_tag(self.held, CALL_OPEN), partial_tag(self.held, FENCE_MARK) if self.schemas else 0)

    def finish(self, stopped: bool) -> list[tuple[str, object]]:
        """The output's end; stopped: it ended by itself (not cut off by max_tokens)."""
        held, self.held = self.held, ""
        if self.state == "call":  # cut off inside a call: dropped, never half-reported
            self.cut = True
            return []
        if self.state == "start":
            if stopped:
                calls = (None if self.fmt.delimited else self.fmt.parse(held, self.strings)) or self.bare_calls(held)
            else:  # cut off: the calls whole before the cut (the whole answer may be one that closed)
                whole = None if self.fmt.delimited else self.fmt.parse(held, self.strings)
                calls = whole or self.calls_before_cut(held)
                if not whole and (calls is not None or self.opens_call(held)):
                    self.cut = True  # the call being written is dropped
            if calls:
                self.called = True
                return [("call", c) for c in calls]
            if self.cut:
                return []
            response = None
            if isinstance(self.fmt, Generic):
                response = Generic.response(held) if stopped else Generic.partial_response(held)
            return [("content", response if response is not None else held)] if held else []
        if self.state == "fence":  # a fence never closed: text, as the model wrote it
            held = self.gap + held
        partial = partial_tag(held, CALL_OPEN) if not stopped and self.fmt.delimited else 0
        if partial:  # a call's opening cut off inside its marker is not text (nor the blank before it)
            held = held[:-partial].rstrip()
        if not held or (self.called and not held.strip()):
            return []
        return [("content", held)]

    def opens_call(self, text: str) -> bool:
        """Whether a whole-answer format's answer, cut off, was (or was starting to be) a call: it
        starts {"tool_calls": [ (generic) or {"name" (Llama 3), or with a part of that."""
        opener = {"generic": '{"tool_calls":[', "llama3": '{"name"'}.get(self.fmt.name)
        squeezed = re.sub(r"\s+", "", text)
        return bool(opener and squeezed) and (opener.startswith(squeezed) or squeezed.startswith(opener))

    def calls_before_cut(self, text: str) -> list[ToolCall] | None:
        """An answer cut off inside a list of calls (the generic format's {"tool_calls": [..., or a bare
        list, fenced or not): the calls whole before the cut (bare ones must name an offered tool with
        arguments that fit); None if the answer is not such a list."""
        body = FENCE_OPEN.sub("", text.strip(), count=1)
        opened = GENERIC_LIST.match(body) if isinstance(self.fmt, Generic) else None
        at = opened.end() if opened else (1 if body.startswith("[") and self.schemas else None)
        if at is None:
            return None
        calls, decoder = [], json.JSONDecoder()
        while True:
            at = len(body) - len(body[at:].lstrip(" \t\n\r,"))
            try:
                obj, at = decoder.raw_decode(body, at)
            except ValueError:  # the cut, or the list's end
                return calls
            call = named_call(obj)
            if call is None or (not opened and not self.fits(*call)):
                return None
            calls.append(new_call(*call))


    def bare_calls(self, text: str) -> list[ToolCall] | None:
        """A whole answer that is a bare call (or a list of them, or several one after another), fenced
        or not: the calls, if each names an offered tool with arguments that fit its schema; else None."""
        body = text.strip()
        fenced = FENCE.fullmatch(body)
        items = json_values((fenced.group(1) if fenced else body).strip())
        if items is None:
            return None
        if len(items) == 1 and isinstance(items[0], list):
            items = items[0]
        calls = []
        for item in items:
            call = named_call(item)
            if call is None or not self.fits(*call):
                return None
            calls.append(new_call(*call))
        return calls or None

    def fits(self, name: str, arguments: dict) -> bool:
        """Whether a bare call names an offered tool and its arguments fit that tool's schema."""
        if name not in self.schemas:
            return False
        import jsonschema  # here, not at the top: ~0.1 s of every server's start, for the bare calls of small models

        try:
            jsonschema.validate(arguments, self.schemas[name])
        except (jsonschema.ValidationError, jsonschema.SchemaError):
            return False
        return True


def json_values(text: str) -> list | None:
    """Text that is JSON values one after another (apart by blanks or commas, as small models write
    several calls): the values; None if anything else is in it."""
    values, at, decoder = [], 0, json.JSONDecoder()
    while at < len(text):
        try:
            value, at = decoder.raw_decode(text, at)
        except ValueError:
            return None
        values.append(value)
        at = len(text) - len(text[at:].lstrip(" \t\r\n,"))
    return values or None


FENCE = re.compile(r"```(?:json)?[ \t]*\n(.*?)\n?```", re.S)
FENCE_MARK = "```"
FENCE_OPEN = re.compile(r"```(?:json)?[ \t]*\n")
GENERIC_LIST = re.compile(r'\{\s*"tool_calls"\s*:\s*\[')


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
