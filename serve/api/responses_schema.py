"""The OpenAI Responses API's wire schema (`POST /v1/responses`): the request (pydantic), and the
response object, its output items and its stream events as plain dicts."""
from __future__ import annotations

import time

from pydantic import BaseModel, ConfigDict, Field


class ResponsesRequest(BaseModel):
    """What Strata reads of a Responses request. Input items stay dicts (serve/http/responses_api.py turns
    them into chat messages, with a 400 naming any it cannot take); unknown fields are accepted and
    ignored, as clients send many (metadata, include, prompt_cache_key, ...)."""

    model_config = ConfigDict(extra="allow")

    model: str | None = None
    input: str | list[dict] = ""
    instructions: str | None = None
    tools: list[dict] | None = None
    tool_choice: str | dict | None = None
    parallel_tool_calls: bool = True
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)  # None: the server's defaults
    top_p: float | None = Field(default=None, gt=0, le=1)
    stream: bool = False
    store: bool = True
    previous_response_id: str | None = None
    text: dict | None = None  # {"format": {"type": "text" | "json_object" | "json_schema", ...}}
    reasoning: dict | None = None
    metadata: dict | None = None
    prompt_cache_key: str | None = None  # the client's session (Codex: its conversation): serve/http/run_request.py session_of
    priority: int = 0
    include: list[str] | None = None  # "message.output_text.logprobs": the answer text's log-probabilities
    top_logprobs: int | None = Field(default=None, ge=0, le=20)

    @property
    def logprobs(self) -> bool:
        return "message.output_text.logprobs" in (self.include or [])


def message_item(item_id: str, text: str, status: str = "completed", logprobs: list[dict] | None = None) -> dict:
    return {"type": "message", "id": item_id, "status": status, "role": "assistant",
            "content": [output_text(text, logprobs)] if status == "completed" else []}


def output_text(text: str, logprobs: list[dict] | None = None) -> dict:
    """logprobs: the text's tokens (serve/api/logprobs.py chat_logprobs' content), when the request's
    include asked for them."""
    return {"type": "output_text", "text": text, "annotations": []} | ({"logprobs": logprobs} if logprobs is not None else {})


def reasoning_item(item_id: str, text: str) -> dict:
    return {"type": "reasoning", "id": item_id, "summary": [],
            "content": [{"type": "reasoning_text", "text": text}]}


def call_item(item_id: str, call: dict, status: str = "completed") -> dict:
    """call: a function_call or custom_tool_call item's fields (serve/api/response_tools.py ToolMap.item)."""
    return {"id": item_id} | call | {"status": status}


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict:
    return {"input_tokens": prompt_tokens, "input_tokens_details": {"cached_tokens": cached_tokens},
            "output_tokens": completion_tokens, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt_tokens + completion_tokens}


def response_object(rid: str, model: str, body: ResponsesRequest, output: list[dict], status: str,
                    usage_: dict | None = None, incomplete: str | None = None, created: int | None = None) -> dict:
    """status: in_progress, completed or incomplete (incomplete: the reason, max_output_tokens)."""
    return {"id": rid, "object": "response", "created_at": created or int(time.time()), "status": status,
            "model": model, "output": output, "usage": usage_, "error": None,
            "incomplete_details": {"reason": incomplete} if incomplete else None,
            "instructions": body.instructions, "max_output_tokens": body.max_output_tokens,
            "parallel_tool_calls": body.parallel_tool_calls, "previous_response_id": body.previous_response_id,
            "temperature": body.temperature, "top_p": body.top_p, "tool_choice": body.tool_choice or "auto",
            "tools": body.tools or [], "store": body.store, "text": body.text or {"format": {"type": "text"}},
            "metadata": body.metadata or {}}
