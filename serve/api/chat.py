"""A chat request in and out: the conversation (tool calls and tool results included) rendered by
the model's template, and the model's text back as OpenAI's message fields: content, the reasoning
of a thinking model (serve/api/reasoning.py) and tool calls in the family's format (serve/api/tool_calls.py).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field

from serve.api import openai_schema as schema
from serve.api.errors import APIError
from serve.api.reasoning import CONTENT, REASONING, ReasoningSplitter, prompt_opens_thinking
from serve.api.tool_calls import FORMATS, ToolCall, ToolCallStream, ToolFormat, format_for_template

GENERIC_INSTRUCTIONS = (
    "You can use the tools below. To use tools, answer with only a JSON object of the form "
    '{"tool_calls": [{"name": "<tool name>", "arguments": {<the arguments>}}]}. '
    'To answer without a tool, answer with only {"response": "<your answer>"}.\n\nTools:\n')


@dataclass(frozen=True)
class ToolPlan:
    """What a request does with tools: the format the model writes calls in (None: no tools, or
    tool_choice "none"), the calls it must make (tool_choice), and whether more than one may come."""

    fmt: ToolFormat | None
    tools: list[dict]
    choice: str | None = None  # "auto", "required", or a function's name
    parallel: bool = True
    # function name -> the parameters schema its calls are held to while the model writes, under every
    # tool_choice (a Responses custom tool's grammar: serve/api/response_tools.py); others only when forced
    enforced: dict[str, dict] = field(default_factory=dict)

    @property
    def forced(self) -> bool:
        return self.choice not in (None, "auto")


def tool_plan(state, body: schema.ChatCompletionRequest) -> ToolPlan:
    tools = [t.model_dump(exclude_none=True) for t in body.tools or []]
    choice = body.tool_choice
    names = [t["function"]["name"] for t in tools]
    if len(set(names)) != len(names):
        raise APIError(400, "tools: function names must be unique", param="tools")
    if isinstance(choice, schema.NamedToolChoice):
        if choice.function.name not in names:
            raise APIError(400, f"tool_choice names the function {choice.function.name!r}, which is not among the "
                                f"tools ({', '.join(names) or 'none given'})", param="tool_choice")
        choice = choice.function.name
    elif choice == "required" and not tools:
        raise APIError(400, "tool_choice is 'required' but no tools were given", param="tool_choice")
    if not tools or choice == "none":
        return ToolPlan(None, [])
    return ToolPlan(format_for_template(state.tokenizer.template.source), tools, choice or "auto",
                    body.parallel_tool_calls)


def render(state, body: schema.ChatCompletionRequest, plan: ToolPlan, generation_prompt: bool = True) -> str:
    """The conversation rendered by the model's template (with the request's chat_template_kwargs
    and tools), ending with the assistant's opening unless generation_prompt is false (/tokenize's
    add_generation_prompt). A template with no tool format of its own gets the generic one: the tools
    in a system message, earlier calls and results as text."""
    generic = plan.fmt is FORMATS["generic"]
    messages = conversation(body, generic)
    if not any(msg["content"].strip() or msg.get("tool_calls") for msg in messages):
        raise APIError(400, "every message is empty", param="messages")
    if generic:
        described = GENERIC_INSTRUCTIONS + "\n".join(json.dumps(t["function"], ensure_ascii=False) for t in plan.tools)
        if messages[0]["role"] == "system":
            messages[0] = messages[0] | {"content": messages[0]["content"] + "\n\n" + described}
        else:
            messages.insert(0, {"role": "system", "content": described})
    try:
        return state.tokenizer.apply_chat_template(messages, body.chat_template_kwargs,
                                                   tools=None if generic or not plan.tools else plan.tools,
                                                   generation_prompt=generation_prompt)
    except ValueError as e:
        raise APIError(400, str(e), param="chat_template_kwargs" if "chat_template_kwargs" in str(e) else "messages") from None


def conversation(body: schema.ChatCompletionRequest, generic: bool) -> list[dict]:
    """Messages as templates read them: an assistant's calls with their arguments as objects (the
    templates write them with tojson or iterate them), each tool result after the call it answers
    (checked), named after its function. With the generic format, calls and results become text."""
    out: list[dict] = []
    open_calls: dict[str, str] = {}  # the latest assistant turn's calls not yet answered: id -> name
    for i, msg in enumerate(body.messages):
        entry = {"role": msg.role, "content": msg.text()}
        if msg.role == "assistant" and msg.tool_calls:
            calls = []
            for call in msg.tool_calls:
                try:
                    args = json.loads(call.function.arguments)
                except ValueError:
                    args = None
                if not isinstance(args, dict):
                    raise APIError(400, f"messages[{i}].tool_calls: the arguments of {call.function.name!r} are not a "
                                        f"JSON object", param=f"messages.{i}.tool_calls")
                calls.append({"id": call.id, "type": "function", "function": {"name": call.function.name, "arguments": args}})
            open_calls = {c["id"]: c["function"]["name"] for c in calls}
            if generic:
                text = json.dumps({"tool_calls": [{"name": c["function"]["name"], "arguments": c["function"]["arguments"]}
                                                  for c in calls]}, ensure_ascii=False)
                entry["content"] = (entry["content"] + "\n" if entry["content"] else "") + text
            else:
                entry["tool_calls"] = calls
        elif msg.role == "tool":
            if not open_calls:
                raise APIError(400, f"messages[{i}] is a tool result with no assistant tool call before it to answer",
                               param=f"messages.{i}")
            call_id = msg.tool_call_id or next(iter(open_calls))
            if call_id not in open_calls:
                raise APIError(400, f"messages[{i}].tool_call_id {call_id!r} matches no call of the assistant turn "
                                    f"before it ({', '.join(open_calls)})", param=f"messages.{i}.tool_call_id")
            name = open_calls.pop(call_id)
            if generic:
                entry = {"role": "user", "content": f"The tool {name} returned: {entry['content']}"}
            else:
                entry |= {"tool_call_id": call_id, "name": name}
        else:
            open_calls = {}
        out.append(entry)
    return out


def reasoning_opened(state, prompt_text: str) -> bool | None:
    """For a thinking model (its template writes <think>) under --reasoning-format deepseek: whether
    the prompt itself leaves a <think> open (the answer starts as reasoning); None when the text is
    left as it is."""
    if state.settings.reasoning_format != "deepseek" or not state.tokenizer.template.thinks:
        return None
    return prompt_opens_thinking(prompt_text)


class ChatOutput:
    """One response's text turned into message fields, piece by piece (a stream) or at once: the
    reasoning split off (opened is not None), then the content's tool calls parsed (plan.fmt)."""

    def __init__(self, opened: bool | None, plan: ToolPlan):
        self.reasoning = ReasoningSplitter(opened) if opened is not None else None
        self.tools = ToolCallStream(plan.fmt, plan.tools) if plan.fmt is not None else None
        self.plan = plan
        self.calls: list[ToolCall] = []

    def feed(self, text: str, end: bool = False, stopped: bool = True) -> list[dict]:
        """Deltas (OpenAI stream delta dicts) for the next piece; end: the output's last piece."""
        if self.reasoning is not None:
            fields = self.reasoning.feed(text) + (self.reasoning.finish() if end else [])
        else:
            fields = [(CONTENT, text)] if text else []
        deltas: list[dict] = []
        for kind, part in fields:
            if kind == REASONING:
                deltas.append({REASONING: part})
            elif self.tools is None:
                deltas.append({CONTENT: part})
            else:
                deltas += self.tool_deltas(self.tools.feed(part))
        if end and self.tools is not None:
            deltas += self.tool_deltas(self.tools.finish(stopped))
        return merge(deltas)

    def tool_deltas(self, events: list[tuple[str, object]]) -> list[dict]:
        out = []
        for kind, value in events:
            if kind == "content":
                out.append({CONTENT: value})
            elif self.plan.parallel or not self.calls:  # parallel_tool_calls false: the first call only
                index = len(self.calls)
                self.calls.append(value)
                head = value.openai(index)
                out.append({"tool_calls": [head | {"function": {"name": value.name, "arguments": ""}}]})
                out.append({"tool_calls": [{"index": index, "function": {"arguments": value.arguments}}]})
        return out

    def finish_reason(self, reason: str) -> str:
        if self.tools is not None and self.tools.cut:
            return "length"
        return "tool_calls" if self.calls and reason == "stop" else reason

    def message(self, text: str, reason: str) -> dict:
        """The whole output as one message's fields."""
        fields: dict[str, str] = {}
        for delta in self.feed(text, end=True, stopped=reason == "stop"):
            for key in (CONTENT, REASONING):
                if key in delta:
                    fields[key] = fields.get(key, "") + delta[key]
        message: dict = {CONTENT: fields.get(CONTENT) or (None if self.calls else "")}
        if self.reasoning is not None:
            message[REASONING] = fields.get(REASONING) or None
        if self.calls:
            message["tool_calls"] = [c.openai(i) for i, c in enumerate(self.calls)]
            for call in message["tool_calls"]:
                del call["index"]
        return message


def merge(deltas: list[dict]) -> list[dict]:
    """Adjacent text deltas of the same fields joined (one chunk per piece where possible)."""
    out: list[dict] = []
    for delta in deltas:
        if out and "tool_calls" not in delta and "tool_calls" not in out[-1] and delta.keys() == out[-1].keys():
            out[-1] = {k: out[-1][k] + delta[k] for k in delta}
        else:
            out.append(delta)
    return out

