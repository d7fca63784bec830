"""The wire schema of the routes outside the OpenAI and Anthropic APIs that local clients and editors
expect of a server (pydantic): /tokenize and /detokenize in llama-server's and vLLM's shapes, /infill
in llama-server's (serve/http/text_api.py)."""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from serve.api import openai_schema as schema


class TokenizeRequest(BaseModel):
    """One of: `content` (llama-server's), `prompt` (vLLM's completion form), `messages` (vLLM's chat
    form: the conversation rendered by the model's template, as /v1/chat/completions reads it)."""

    model_config = ConfigDict(extra="ignore")
    model: str | None = None
    content: str | None = None
    prompt: str | None = None
    messages: list[schema.ChatMessage] | None = Field(default=None, min_length=1)
    tools: list[schema.Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | schema.NamedToolChoice | None = None
    chat_template_kwargs: dict[str, object] | None = None
    add_generation_prompt: bool = True
    add_special: bool | None = Field(default=None, description="llama-server's: the model's BOS, if it adds one")
    add_special_tokens: bool | None = Field(default=None, description="vLLM's name for add_special")
    parse_special: bool = Field(default=True, description="false: control tokens' text (<|im_end|>) is plain text")
    with_pieces: bool = False

    @model_validator(mode="after")
    def _one_input(self):
        given = [name for name in ("content", "prompt", "messages") if getattr(self, name) is not None]
        if len(given) != 1:
            raise ValueError("give one of content, prompt or messages")
        return self

    def wants_special(self) -> bool:
        """Whether to add the model's BOS: as asked, else vLLM's default for its completion form (true) and
        llama-server's for `content` (false)."""
        asked = self.add_special if self.add_special is not None else self.add_special_tokens
        return asked if asked is not None else self.prompt is not None

    def chat(self) -> schema.ChatCompletionRequest:
        return schema.ChatCompletionRequest(messages=self.messages, tools=self.tools, tool_choice=self.tool_choice,
                                            chat_template_kwargs=self.chat_template_kwargs)


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: str | None = None
    tokens: list[int]


class InfillFile(BaseModel):
    model_config = ConfigDict(extra="ignore")
    filename: str = "tmp"  # llama-server's default
    text: str = ""


class InfillRequest(schema.SamplingFields):
    """llama-server's /infill: the code before and after the cursor, other files of the project, and
    `prompt`: what is already typed at the cursor. Its sampling fields as /completion's (n_predict;
    -1 seed or n_predict: unset), or OpenAI's."""

    input_prefix: str = ""
    input_suffix: str = ""
    input_extra: list[InfillFile] = Field(default_factory=list)
    prompt: str = ""
    n_predict: int | None = None
    n: int = Field(default=1, ge=1, le=1, description="one answer a request")
    response_fields: list[str] | None = Field(default=None, description="llama-server's: only these fields, by path "
                                                                        "(\"timings/prompt_n\")")
    t_max_predict_ms: int | None = Field(default=None, description="llama-server's: the answer ends once this many ms "
                                                                   "past its first token, when it has a new line")

    @field_validator("seed", "n_predict", "t_max_predict_ms", mode="before")
    @classmethod
    def _negative_is_unset(cls, v):
        return None if isinstance(v, int) and v < 0 else v

    def limit(self) -> int | None:
        return self.n_predict if self.n_predict is not None else self.max_tokens

    def extra(self) -> list[tuple[str, str]]:
        return [(f.filename, f.text) for f in self.input_extra]
