"""The Anthropic Messages wire schema (pydantic): requests in, message bodies, stream events and
errors out. What Claude-Code-style agents send to /v1/messages."""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class TextBlock(BaseModel):
    model_config = ConfigDict(extra="ignore")  # cache_control, citations
    type: Literal["text"]
    text: str


class ThinkingBlock(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["thinking", "redacted_thinking"]
    thinking: str = ""


class ToolUseBlock(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["tool_use"]
    id: str
    name: str
    input: dict


class ToolResultBlock(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["tool_result"]
    tool_use_id: str
    content: str | list[TextBlock] = ""
    is_error: bool = False

    def text(self) -> str:
        body = self.content if isinstance(self.content, str) else "".join(b.text for b in self.content)
        return f"Error: {body}" if self.is_error else body


Block = TextBlock | ThinkingBlock | ToolUseBlock | ToolResultBlock


class Message(BaseModel):
    role: Literal["user", "assistant"]
    content: str | list[Block]

    def blocks(self) -> list[Block]:
        return [TextBlock(type="text", text=self.content)] if isinstance(self.content, str) else self.content


class ToolDef(BaseModel):
    model_config = ConfigDict(extra="ignore")  # type (custom), cache_control
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.\-]+$")
    description: str | None = None
    input_schema: dict


class ToolChoice(BaseModel):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool = False


class Thinking(BaseModel):
    model_config = ConfigDict(extra="ignore")  # budget_tokens
    type: Literal["enabled", "disabled", "adaptive"]


class CountTokensRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")  # metadata, service_tier, ...
    model: str | None = None
    messages: list[Message] = Field(min_length=1)
    system: str | list[TextBlock] | None = None
    tools: list[ToolDef] | None = None
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None


class MessagesRequest(CountTokensRequest):
    max_tokens: int = Field(ge=1)
    metadata: dict | None = None  # user_id: the client's session (Claude Code names its session there)
    stream: bool = False
    temperature: float | None = Field(default=None, ge=0, le=1)  # None: the server's defaults
    top_p: float | None = Field(default=None, gt=0, le=1)
    top_k: int | None = Field(default=None, ge=0)
    stop_sequences: list[str] | None = Field(default=None, max_length=4)


def usage(prompt_tokens: int, output_tokens: int, cached_tokens: int = 0) -> dict:
    """Anthropic counts the prompt in parts: input_tokens read now, cache_read_input_tokens the start
    a slot still held from an earlier turn (Strata writes no explicit cache entries)."""
    return {"input_tokens": prompt_tokens - cached_tokens, "output_tokens": output_tokens,
            "cache_read_input_tokens": cached_tokens, "cache_creation_input_tokens": 0}


def message_body(mid: str, model: str, content: list[dict], stop_reason: str | None, prompt_tokens: int,
                 output_tokens: int, stop_sequence: str | None = None, cached_tokens: int = 0) -> dict:
    return {"id": mid, "type": "message", "role": "assistant", "model": model, "content": content,
            "stop_reason": stop_reason, "stop_sequence": stop_sequence,
            "usage": usage(prompt_tokens, output_tokens, cached_tokens)}


def error_body(message: str, type_: str = "invalid_request_error") -> dict:
    return {"type": "error", "error": {"type": type_, "message": message}}


ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 529: "overloaded_error"}


def error_type(status: int) -> str:
    return ERROR_TYPES.get(status, "invalid_request_error" if status < 500 else "api_error")
