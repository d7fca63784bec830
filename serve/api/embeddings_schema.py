"""OpenAI's embeddings API (pydantic): the request, each input's tokens, the response body. The vectors are
L2-normalised, as OpenAI's and llama-server's are; `dimensions` keeps the first N values and normalises
those (what Matryoshka-trained models, Qwen3-Embedding among them, allow)."""
from __future__ import annotations

import base64
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from engine.modelfile.token_segments import TooManyTokens
from serve.api.errors import APIError
from serve.api.prompt_fit import PromptFit
from serve.api.prompt_tokens import check_ids

MAX_INPUTS = 2048  # inputs one request may hold (OpenAI's limit)


class EmbeddingRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    input: str | list[str] | list[int] | list[list[int]] = Field(
        description="a text, texts, a text's token ids, or several texts' token ids")
    model: str | None = None
    encoding_format: Literal["float", "base64"] = Field(
        default="float", description="base64: each vector's float32 values, little-endian, in base64")
    dimensions: int | None = Field(default=None, ge=1, description="the first N values, normalised again")
    user: str | None = None

    def inputs(self) -> list[str | list[int]]:
        """Each input: a text, or a text's token ids."""
        if isinstance(self.input, str):
            return [self.input]
        if self.input and isinstance(self.input[0], int):
            return [list(self.input)]
        return list(self.input)


def too_long(tokens: int | str, ctx: int, i: int) -> APIError:
    return APIError(400, f"input {i} is too long: {tokens} tokens > {ctx - 1} maximum (the context holds {ctx})",
                    param="input", code="context_length_exceeded")


def input_tokens(state, fit: PromptFit, body: EmbeddingRequest) -> list[list[int]]:
    """Each input's tokens, as llama-server reads an embedding's: a text with the model's BOS where it adds
    one, and its EOS where the file says so (tokenizer.ggml.add_eos_token: Qwen3-Embedding's, whose vector
    is its last token's); token ids as they are. An empty input, or one over the context, is refused."""
    inputs, ctx, tokenizer = body.inputs(), state.ctx, state.tokenizer
    eos = [tokenizer.special.eos] if tokenizer.special.add_eos else []
    if not inputs:
        raise APIError(400, "input is empty: give a text, texts, or token ids", param="input")
    if len(inputs) > MAX_INPUTS:
        raise APIError(400, f"{len(inputs)} inputs: at most {MAX_INPUTS} a request", param="input")
    out = []
    for i, item in enumerate(inputs):
        if not item:
            raise APIError(400, f"input {i} is empty", param="input")
        if isinstance(item, str):
            fit.check(item, ctx)
            try:
                item = tokenizer.encode(item, limit=ctx - 1 - len(eos)) + eos
            except TooManyTokens as e:
                raise too_long(e.tokens + len(eos), ctx, i) from None
        else:
            check_ids(item, tokenizer.vocab_size, f"input {i}:", param="input")
        if len(item) >= ctx:
            raise too_long(len(item), ctx, i)
        out.append(item)
    return out


def check_dimensions(dimensions: int | None, width: int | None) -> None:
    """`dimensions` past the model's width (its INFO dim=, or a vector's length) is refused."""
    if dimensions is not None and width is not None and dimensions > width:
        raise APIError(400, f"dimensions {dimensions} is more than the model's {width}", param="dimensions")


def normalised(vector, dimensions: int | None) -> np.ndarray:
    """The vector's first `dimensions` values (all without) divided by their L2 norm, float32 (n,)."""
    v = np.asarray(vector, dtype=np.float64)[:dimensions]  # (n,)
    norm = float(np.sqrt(np.dot(v, v)))
    return (v / norm if norm > 0 else v).astype(np.float32)


def embeddings_body(vectors: list, body: EmbeddingRequest, model: str, prompt_tokens: int) -> dict:
    """OpenAI's response: each input's normalised vector as float values, or its float32 bytes in base64."""
    check_dimensions(body.dimensions, min(len(v) for v in vectors))
    data = []
    for i, vector in enumerate(vectors):
        v = normalised(vector, body.dimensions)
        values = base64.b64encode(v.astype("<f4").tobytes()).decode() if body.encoding_format == "base64" \
            else v.tolist()
        data.append({"object": "embedding", "index": i, "embedding": values})
    return {"object": "list", "data": data, "model": model,
            "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens}}
