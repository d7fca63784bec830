"""The Anthropic Messages wire schema (pydantic): requests in, message bodies, stream events and
errors out. What Claude-Code-style agents send to /v1/messages."""
from __future__ import annotations

import base64
import binascii
import json
from typing import Annotated, Literal, Union

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag


class TextBlock(BaseModel):
    model_config = ConfigDict(extra="ignore")  # cache_control, citations
    type: Literal["text"]
    text: str


class ImageBlock(BaseModel):
    """Never read: Strata's models read text only (messages_api puts a placeholder in its place), so its
    source (base64, url or file) is not looked at."""
    model_config = ConfigDict(extra="ignore")  # source, cache_control
    type: Literal["image"]


class DocumentSource(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: str  # text, content, base64 (a PDF), url, file
    media_type: str | None = None
    data: str | None = None
    content: Content | None = None  # type content: text (and image) blocks

    def plain_text(self) -> str | None:
        """The document's text when its source is text (a text source, or base64 of a text/* type);
        None for a PDF, a URL or a file id, which Strata cannot read."""
        if self.type == "text" and self.data is not None:
            return self.data
        if self.type == "base64" and self.data is not None and (self.media_type or "").startswith("text/"):
            try:
                return base64.b64decode(self.data, validate=True).decode()
            except (binascii.Error, UnicodeDecodeError):
                return None
        return None

    def described(self) -> str:
        """What the source is, for a refusal."""
        return f"{self.type} ({self.media_type})" if self.media_type else self.type


class DocumentBlock(BaseModel):
    model_config = ConfigDict(extra="ignore")  # citations, cache_control
    type: Literal["document"]
    source: DocumentSource
    title: str | None = None
    context: str | None = None

    def framed(self, body: str) -> str:
        """The document's text under its title and context, as the model reads it."""
        head = ([f"Document: {self.title}"] if self.title else []) + ([self.context] if self.context else [])
        return "\n".join(head + [body])


class SearchResultBlock(BaseModel):
    model_config = ConfigDict(extra="ignore")  # citations, cache_control
    type: Literal["search_result"]
    source: str
    title: str
    content: list[TextBlock]

    def as_text(self) -> str:
        return "\n".join([f"Search result: {self.title}", f"Source: {self.source}", *(b.text for b in self.content)])


class ToolReferenceBlock(BaseModel):
    """A tool search's answer (in a tool_result): the tool it found. Strata offers every tool given (a
    deferred one too), so the reference only tells the model the tool's name."""
    model_config = ConfigDict(extra="ignore")
    type: Literal["tool_reference"]
    tool_name: str

    def as_text(self) -> str:
        return f"[tool found: {self.tool_name}]"


class ThinkingBlock(BaseModel):
    model_config = ConfigDict(extra="ignore")  # signature; data (redacted)
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
    content: Content = ""
    is_error: bool | None = False


class ServerToolUseBlock(BaseModel):
    """A call Anthropic's servers ran (web search) in a history begun there: kept as text."""
    model_config = ConfigDict(extra="ignore")  # caller, cache_control
    type: Literal["server_tool_use"]
    name: str
    input: dict

    def as_text(self) -> str:
        return f"[{self.name}: {json.dumps(self.input, ensure_ascii=False)}]"


class WebSearchToolResultBlock(BaseModel):
    """A web search's results from Anthropic's servers: their titles and addresses as text (the pages'
    encrypted content is not readable)."""
    model_config = ConfigDict(extra="ignore")
    type: Literal["web_search_tool_result"]
    content: list[dict] | dict

    def as_text(self) -> str:
        if isinstance(self.content, dict):
            return f"[web search failed: {self.content.get('error_code', 'error')}]"
        found = [f"- {r.get('title', '')} ({r.get('url', '')})" for r in self.content]
        return "\n".join(["Web search results:", *found])


class OtherBlock(BaseModel):
    """A block of a type Strata does not read: taken in, so that messages_api can refuse it by name."""
    model_config = ConfigDict(extra="allow")
    type: str


KNOWN_BLOCKS = {"text": TextBlock, "image": ImageBlock, "document": DocumentBlock, "search_result": SearchResultBlock,
                "tool_reference": ToolReferenceBlock, "thinking": ThinkingBlock, "redacted_thinking": ThinkingBlock,
                "tool_use": ToolUseBlock, "tool_result": ToolResultBlock, "server_tool_use": ServerToolUseBlock,
                "web_search_tool_result": WebSearchToolResultBlock}


def block_tag(value) -> str:
    """A block's model by its type; any other type is an OtherBlock (refused by name, not with a union's
    list of every model it failed)."""
    kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    return kind if kind in KNOWN_BLOCKS else "other"


Block = Annotated[Union[tuple(Annotated[model, Tag(kind)] for kind, model in KNOWN_BLOCKS.items())
                        + (Annotated[OtherBlock, Tag("other")],)], Discriminator(block_tag)]
# a string or a list of blocks, told apart first, so that a bad block's error names the block (not "a valid string")
Content = Annotated[Union[Annotated[str, Tag("text")], Annotated[list[Block], Tag("blocks")]],
                    Discriminator(lambda value: "text" if isinstance(value, str) else "blocks")]
DocumentSource.model_rebuild()
DocumentBlock.model_rebuild()
ToolResultBlock.model_rebuild()


class Message(BaseModel):
    # system: an instruction given mid-conversation (Claude Code sends them); text blocks only
    role: Literal["user", "assistant", "system"]
    content: Content

    def blocks(self) -> list[Block]:
        return [TextBlock(type="text", text=self.content)] if isinstance(self.content, str) else self.content


class ToolDef(BaseModel):
    model_config = ConfigDict(extra="ignore")  # cache_control, defer_loading, strict, ...
    type: str | None = None  # custom, or one Anthropic defines (web_search_20250305, bash_20250124, ...)
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.\-]+$")
    description: str | None = None
    input_schema: dict | None = None  # None: a tool Anthropic's servers define, refused by messages_api


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
