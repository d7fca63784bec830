"""The OpenAI wire schema (pydantic): requests in, response bodies and stream chunks out."""
from __future__ import annotations

import time
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


class TextPart(BaseModel):
    type: Literal["text"]
    text: str


class FunctionCall(BaseModel):
    name: str
    arguments: str  # JSON text of an object, as OpenAI sends it


class ToolCallIn(BaseModel):
    """A call the assistant made earlier in the conversation."""

    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | list[TextPart] | None = None
    tool_calls: list[ToolCallIn] | None = None  # assistant
    tool_call_id: str | None = None  # tool: the call this answers

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(p.text for p in self.content)
        return self.content or ""


class FunctionDef(BaseModel):
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.\-]+$")
    description: str | None = None
    parameters: dict | None = None  # a JSON schema of the arguments object


class Tool(BaseModel):
    type: Literal["function"]
    function: FunctionDef


class NamedFunction(BaseModel):
    name: str


class NamedToolChoice(BaseModel):
    type: Literal["function"]
    function: NamedFunction


class JsonSchemaFormat(BaseModel):
    name: str = "response"
    schema_: dict | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(BaseModel):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class StreamOptions(BaseModel):
    include_usage: bool = False


class SamplingFields(BaseModel):
    """Fields shared by both endpoints. Unknown fields are ignored, as OpenAI clients send many."""

    model_config = ConfigDict(extra="ignore")
    model: str | None = None
    max_tokens: int | None = Field(default=None, description="tokens to generate at most")
    # left out (None): the server's defaults, serve/api/sampling_defaults.py
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    top_k: int | None = Field(default=None, ge=0)
    min_p: float | None = Field(default=None, ge=0, le=1)
    seed: int | None = Field(default=None, ge=0, lt=2**63)
    presence_penalty: float = Field(default=0.0, ge=-2, le=2)
    frequency_penalty: float = Field(default=0.0, ge=-2, le=2)
    repeat_penalty: float = Field(default=1.0, gt=0, le=10)
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = Field(default=1, ge=1, le=16, description="answers to the prompt, each seeded apart")
    prompt_cache_key: str | None = Field(default=None, description="the client's session: its cached prompt prefix "
                                                                    "outlives one-off requests' (as OpenAI's routing key)")
    priority: int = Field(default=0, ge=-2**31, lt=2**31,
                          description="lower runs first (as vLLM's); a lower class never preempts a higher one")

    @field_validator("stop")
    @classmethod
    def _at_most_four(cls, v):
        if isinstance(v, list) and len(v) > 4:
            raise ValueError("at most 4 stop strings")
        return v

    def stop_strings(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)

    def gen_params(self) -> dict:
        """The sampling fields the request gives (the server's defaults fill the others)."""
        params = {"temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k, "min_p": self.min_p,
                  "presence_penalty": self.presence_penalty, "frequency_penalty": self.frequency_penalty,
                  "repeat_penalty": self.repeat_penalty, "seed": self.seed, "logprobs": self.top_logprobs_asked()}
        return {k: v for k, v in params.items() if v is not None}

    def top_logprobs_asked(self) -> int | None:
        """How many likeliest tokens to give beside each answer token's log-probability (0: its own
        only), or None: no log-probabilities."""
        return None


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = None
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool = True
    response_format: ResponseFormat | None = None
    chat_template_kwargs: dict[str, object] | None = Field(
        default=None, description="extra variables for the model's chat template, e.g. {\"enable_thinking\": false} "
                                  "(as vLLM and llama.cpp accept)")
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)

    @model_validator(mode="after")
    def _top_needs_logprobs(self):
        if self.top_logprobs and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs: true")
        return self

    def top_logprobs_asked(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None


class CompletionRequest(SamplingFields):
    prompt: str | list[int] | list[str]
    logprobs: int | None = Field(default=None, ge=0, le=20, description="the likeliest tokens to list beside each "
                                                                         "answer token's log-probability")
    echo: bool = Field(default=False, description="the prompt's text before the answer's")
    suffix: str | None = Field(default=None, description="the text after the insertion: the answer fills in the middle, "
                                                         "with the model's FIM tokens")

    @model_validator(mode="after")
    def _suffix_needs_text(self):
        if self.suffix is not None and not (isinstance(self.prompt, str) or isinstance(self.prompt[0], str)):
            raise ValueError("suffix needs the prompt as text (the code before the insertion)")
        return self

    def top_logprobs_asked(self) -> int | None:
        return self.logprobs

    def gen_params(self) -> dict:
        """With echo and logprobs, the prompt's log-probabilities too (GEN prompt_logprobs)."""
        echoed = {"prompt_logprobs": self.logprobs} if self.echo and self.logprobs is not None else {}
        return super().gen_params() | echoed

    @field_validator("prompt")
    @classmethod
    def _single_prompt(cls, v):
        if isinstance(v, list) and v and isinstance(v[0], str):
            if len(v) != 1:
                raise ValueError("only one prompt per request is supported")
        if isinstance(v, list) and not v:
            raise ValueError("prompt must not be empty")
        return v


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> dict:
    """cached_tokens: the prompt's start the prefix cache held (another request's blocks: not read again)."""
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached_tokens}}


def chat_body(rid: str, model: str, message: dict, finish: str, prompt_tokens: int, completion_tokens: int,
              timings: dict, cached_tokens: int = 0, logprobs: dict | None = None) -> dict:
    """message: the assistant's fields: content, and reasoning_content for a thinking model."""
    return {"id": rid, "object": "chat.completion", "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant"} | message, "finish_reason": finish,
                         "logprobs": logprobs}],
            "usage": usage(prompt_tokens, completion_tokens, cached_tokens), "timings": timings}


def chat_chunk(rid: str, model: str, delta: dict, finish: str | None = None, logprobs: dict | None = None) -> dict:
    choice = {"index": 0, "delta": delta, "finish_reason": finish} | ({"logprobs": logprobs} if logprobs else {})
    return {"id": rid, "object": "chat.completion.chunk", "created": int(time.time()), "model": model,
            "choices": [choice]}


def completion_body(rid: str, model: str, text: str, finish: str, prompt_tokens: int, completion_tokens: int,
                    timings: dict, cached_tokens: int = 0, logprobs: dict | None = None) -> dict:
    return {"id": rid, "object": "text_completion", "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "text": text, "finish_reason": finish, "logprobs": logprobs}],
            "usage": usage(prompt_tokens, completion_tokens, cached_tokens), "timings": timings}


def completion_chunk(rid: str, model: str, text: str, finish: str | None = None, logprobs: dict | None = None) -> dict:
    return {"id": rid, "object": "text_completion", "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "text": text, "finish_reason": finish, "logprobs": logprobs}]}


def usage_chunk(rid: str, model: str, obj: str, prompt_tokens: int, completion_tokens: int,
                cached_tokens: int = 0) -> dict:
    return {"id": rid, "object": obj, "created": int(time.time()), "model": model, "choices": [],
            "usage": usage(prompt_tokens, completion_tokens, cached_tokens)}


def error_body(message: str, type_: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}
