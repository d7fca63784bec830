"""The grammar a chat request's output must match, for the engine's constrained decoding
(engine/runner/grammar_mask.py): response_format (json_object, json_schema) as a JSON schema, and a forced tool
call (tool_choice "required" or a named function) in the model's own call format with each
function's parameters schema. Grammars are llguidance's (JSON schemas, Lark); they are checked here
against the tokenizer, so a bad schema is the client's 400, never an engine error."""
from __future__ import annotations

import json

import llguidance

from serve.api import openai_schema as schema
from serve.api.chat import ToolPlan
from serve.api.errors import APIError

JSON_OPTIONS = {"whitespace_flexible": False}  # compact JSON: a small model cannot wander off in blanks


def grammar_for(state, plan: ToolPlan, body: schema.ChatCompletionRequest) -> str | None:
    """llguidance grammar text, or None when the output is free."""
    if plan.forced or (plan.enforced and plan.fmt is not None):
        grammar, param = tool_grammar(plan, state.tokenizer), "tools"
    else:
        fmt = body.response_format
        if fmt is None or fmt.type == "text":
            return None
        if fmt.type == "json_schema" and (fmt.json_schema is None or fmt.json_schema.schema_ is None):
            raise APIError(400, "response_format json_schema needs json_schema.schema", param="response_format")
        target = {"type": "object"} if fmt.type == "json_object" else fmt.json_schema.schema_
        grammar, param = json_grammar(target, "response_format"), "response_format"
    check(state, grammar, param)
    return grammar


def json_grammar(target: dict, param: str) -> str:
    try:
        return llguidance.LLMatcher.grammar_from_json_schema(target, defaults=JSON_OPTIONS)
    except (ValueError, RuntimeError, TypeError) as e:
        raise APIError(400, f"{param}: invalid JSON schema: {e}", param=param) from None


def check(state, grammar: str, param: str) -> None:
    error = llguidance.LLMatcher.validate_grammar(grammar, state.grammar_tokenizer.lltokenizer)
    if error:
        raise APIError(400, f"{param}: the schema cannot be enforced: {error}", param=param)


def tool_grammar(plan: ToolPlan, tokenizer) -> str:
    """Calls written as the model's format writes them, with arguments that match each function's
    parameters schema. Forced (tool_choice "required" or a function's name): one call of the allowed
    functions (or, with parallel_tool_calls, one or more) and nothing else. Under "auto" (a plan with
    enforced functions): free text, and wherever the model opens a call, a call that matches."""
    forced = plan.forced
    functions = [t["function"] for t in plan.tools if not forced or plan.choice in ("required", t["function"]["name"])]
    schemas = [call_schema(f, "arguments", plan.enforced) for f in functions]
    name = plan.fmt.name
    if name in ("generic", "llama3"):  # the call is the whole answer, a JSON object
        if name == "generic":
            calls = {"type": "array", "items": {"anyOf": schemas}, "minItems": 1} | ({} if plan.parallel else {"maxItems": 1})
            answer = {"type": "object", "properties": {"tool_calls": calls}, "required": ["tool_calls"],
                      "additionalProperties": False}
            if not forced:
                answer = {"anyOf": [answer, {"type": "object", "properties": {"response": {"type": "string"}},
                                             "required": ["response"], "additionalProperties": False}]}
        else:
            answer = {"anyOf": [call_schema(f, "parameters", plan.enforced) for f in functions]}
            tag = tokenizer.added_token_id("<|python_tag|>")
            if forced and tag is not None:  # Llama 3.1 may open its call with this special token
                return lark(f"start: <[{tag}]>? answer\nanswer: %json {json.dumps(answer | {'x-guidance': JSON_OPTIONS})}\n")
        if forced:
            return json_grammar(answer, "tools")
        return lark(f"start: FREE | answer\nFREE: /([^{{](.|\\n)*)?/\nanswer: %json {json.dumps(answer | {'x-guidance': JSON_OPTIONS})}\n")
    open_, close = marker("<tool_call>", tokenizer), marker("</tool_call>", tokenizer)
    if name == "hermes":
        inner = '"\\n" body "\\n"'
        rules = "body: %json " + json.dumps({"anyOf": schemas} | {"x-guidance": JSON_OPTIONS})
    else:  # qwen3-coder's XML form
        inner = '"\\n<function=" NAME ">\\n" param* "</function>\\n"'
        rules = (f'NAME: {" | ".join(json.dumps(f["name"]) for f in functions)}\n'
                 'param: "<parameter=" PNAME ">\\n" VALUE "</parameter>\\n"\n'
                 'PNAME: /[A-Za-z0-9_.-]+/\nVALUE: /[^<]*/')
    if forced:  # calls apart by a new line, none after the last (as the templates write them): a line
        # forced after every call reads to a small model as the start of another, and it repeats its call
        more = ' ("\\n" call)*' if plan.parallel else ""
        return lark(f'start: call{more}\ncall: {open_} {inner} {close}\n{rules}\n')
    # free text up to the marker: a lazy rule ends at the marker's text; the added token (a special
    # token, which free text never contains) ends TEXT by itself
    token = tokenizer.added_token_id("<tool_call>")
    head = "text_head" + (f" | TEXT <[{token}]>" if token is not None else "")
    return lark(f'start: call{"*" if plan.parallel else "?"} TEXT\ncall: head {inner} {close}\n'
                f'head: {head}\ntext_head[lazy]: TEXT "<tool_call>"\nTEXT: /(.|\\n)*/\n{rules}\n')


def lark(text: str) -> str:
    return llguidance.LLMatcher.grammar_from_lark(text)


def marker(text: str, tokenizer) -> str:
    """A Lark literal for a call format's marker. Where the vocabulary has an added token spelled so
    (Qwen's <tool_call>), llguidance reads that token as a special one, not as its text, and the
    literal alone would let the mask offer the token and then refuse it: the token is allowed too."""
    token = tokenizer.added_token_id(text)
    return json.dumps(text) if token is None else f"({json.dumps(text)} | <[{token}]>)"


SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")  # name -> schema
VALUES = ("const", "enum", "default", "examples")  # data, not schemas


def closed(schema_):
    """A copy of a JSON schema in which every object that lists its properties and says nothing of
    additionalProperties allows no others (llama.cpp's rule, common/json-schema.cpp): a forced call's
    arguments take the declared keys only, so a small model cannot wander into keys like "type"."""
    if isinstance(schema_, list):
        return [closed(s) for s in schema_]
    if not isinstance(schema_, dict):
        return schema_
    out = {}
    for key, value in schema_.items():
        if key in SCHEMA_MAPS and isinstance(value, dict):
            out[key] = {name: closed(s) for name, s in value.items()}
        else:
            out[key] = value if key in VALUES else closed(value)
    if isinstance(schema_.get("properties"), dict):
        out.setdefault("additionalProperties", False)
    return out


def call_schema(function: dict, arguments_key: str, enforced: dict[str, dict]) -> dict:
    """enforced: the parameters schemas that override a function's own (serve/api/chat.py ToolPlan)."""
    parameters = closed(enforced.get(function["name"]) or function.get("parameters") or {"type": "object"})
    return {"type": "object", "properties": {"name": {"const": function["name"]}, arguments_key: parameters},
            "required": ["name", arguments_key], "additionalProperties": False}
