"""The Responses API's tool kinds as chat functions, and the model's calls back as Responses items.

    function    {"type": "function", "name", "parameters"}: a chat function, as it is
    namespace   {"type": "namespace", "name": NS, "tools": [function | custom ...]} (Codex's MCP
                servers): each tool becomes the chat function NS__NAME; its calls come back as
                items named NAME with "namespace": NS
    custom      {"type": "custom", "name", "format": text | {"type": "grammar", "syntax": "lark" |
                "regex", "definition"}} (Codex's apply_patch): a chat function of one string,
                `input`, described to the model with its grammar; its calls come back as
                custom_tool_call items whose `input` is that string. The grammar is enforced while the
                model writes (llguidance, through a JSON-schema `pattern` on `input`) when it is a
                regex or a regular Lark grammar (serve/api/lark_regex.py); the text form lets any text.

Tools that OpenAI's servers run themselves (web search, file search, code interpreter, ...) cannot
run here; they are left out of what the model sees, and the server log says so.
"""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field

from serve.api.errors import APIError
from serve.api.lark_regex import NotRegular, lark_to_regex

log = logging.getLogger("strata.responses")

HOSTED = {"web_search", "web_search_preview", "file_search", "code_interpreter", "image_generation",
          "computer_use_preview", "mcp", "local_shell", "tool_search"}
SEPARATOR = "__"  # namespace__name


@dataclass(frozen=True)
class Origin:
    """Where a chat function came from."""

    name: str
    namespace: str | None = None
    custom: bool = False


@dataclass
class ToolMap:
    """A request's Responses tools: the chat functions the template renders, each function's origin,
    and (custom tools with an enforceable grammar) the parameters schema the output is held to."""

    functions: list[dict] = field(default_factory=list)
    origins: dict[str, Origin] = field(default_factory=dict)
    enforced: dict[str, dict] = field(default_factory=dict)

    def add(self, tool: dict, where: str, namespace: str | None = None) -> None:
        kind = tool.get("type")
        if kind == "namespace" and namespace is None:
            inner = tool.get("tools")
            if not isinstance(inner, list) or not isinstance(tool.get("name"), str):
                raise APIError(400, f"{where}: a namespace needs a name and a list of tools", param="tools")
            for i, sub in enumerate(inner):
                self.add(sub, f"{where}.tools[{i}]", tool["name"])
            return
        if kind in HOSTED:
            log.warning("%s: %s tools are run by OpenAI's servers and cannot run here; left out", where, kind)
            return
        if kind not in ("function", "custom"):
            raise APIError(400, f"{where}: tools of type {kind!r} are not supported (function, custom and namespace "
                                f"tools are)", param="tools")
        name = tool.get("name")
        if not isinstance(name, str) or not name:
            raise APIError(400, f"{where}: a tool needs a name", param="tools")
        flat = flat_name(name, namespace)
        if flat in self.origins:
            raise APIError(400, f"{where}: two tools are named {flat!r}", param="tools")
        self.origins[flat] = Origin(name, namespace, kind == "custom")
        if kind == "function":
            self.functions.append({"type": "function", "function": {
                "name": flat, "description": tool.get("description"), "parameters": tool.get("parameters")}})
            return
        description, pattern = custom_input(tool, where)
        parameters = {"type": "object", "properties": {"input": {"type": "string", "description": description}},
                      "required": ["input"], "additionalProperties": False}
        self.functions.append({"type": "function", "function": {
            "name": flat, "description": tool.get("description"), "parameters": parameters}})
        if pattern is not None:
            held = json.loads(json.dumps(parameters))
            held["properties"]["input"]["pattern"] = pattern
            self.enforced[flat] = held

    def item(self, call_id: str, flat: str, arguments: str) -> dict:
        """A call the model made, as a Responses output item (without its id)."""
        origin = self.origins.get(flat, Origin(flat))
        where = {"namespace": origin.namespace} if origin.namespace else {}
        if origin.custom:
            return {"type": "custom_tool_call", "call_id": call_id, "name": origin.name,
                    "input": custom_text(arguments)} | where
        return {"type": "function_call", "call_id": call_id, "name": origin.name, "arguments": arguments} | where


def flat_name(name: str, namespace: str | None = None) -> str:
    """The chat function's name of a tool (in a namespace: NS__NAME)."""
    return f"{namespace}{SEPARATOR}{name}" if namespace else name


def build(tools: list[dict] | None) -> ToolMap:
    out = ToolMap()
    for i, tool in enumerate(tools or []):
        if not isinstance(tool, dict):
            raise APIError(400, f"tools[{i}] is not an object", param="tools")
        out.add(tool, f"tools[{i}]")
    return out


def custom_input(tool: dict, where: str) -> tuple[str, str | None]:
    """A custom tool's input, described for the model, and the regex it is held to (None: free text)."""
    fmt = tool.get("format") or {"type": "text"}
    if fmt.get("type") == "text":
        return "The tool's input: free text, written as it is.", None
    if fmt.get("type") != "grammar" or fmt.get("syntax") not in ("lark", "regex") or not isinstance(
            fmt.get("definition"), str):
        raise APIError(400, f"{where}.format: a custom tool's format is text, or a grammar with syntax lark or regex "
                            "and a definition", param="tools")
    definition, syntax = fmt["definition"], fmt["syntax"]
    described = f"The tool's input: text that follows this {syntax} grammar.\n{definition}"
    if syntax == "regex":
        return described, f"^(?:{definition})$"
    try:
        return described, lark_to_regex(definition)
    except NotRegular as e:
        log.warning("%s: the grammar of %r is not enforced while the model writes (%s)", where, tool.get("name"), e)
        return described, None
    except ValueError as e:
        raise APIError(400, f"{where}.format.definition: {e}", param="tools") from None


def custom_text(arguments: str) -> str:
    """A custom tool's input from the chat arguments the model wrote ({"input": "..."})."""
    try:
        args = json.loads(arguments)
    except ValueError:
        return arguments
    return args["input"] if isinstance(args, dict) and isinstance(args.get("input"), str) else arguments
