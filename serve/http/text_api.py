"""What local clients and editors expect of a server beside the OpenAI and Anthropic APIs, at the paths
llama-server and vLLM give them (no /v1), behind the API key like /v1:

- POST /tokenize: {"content"} (llama-server's: add_special, parse_special, with_pieces), {"prompt"} or
  {"messages"} (vLLM's: add_special_tokens; a chat's tokens as /v1/chat/completions reads them)
  -> {"tokens", "count", "max_model_len"}
- POST /detokenize: {"tokens"} -> {"content"} (llama-server's name), {"prompt"} (vLLM's)
- POST /infill: llama-server's fill-in-the-middle (llama.vscode's and other editors' completions):
  input_prefix, input_suffix, input_extra, prompt and /completion's sampling fields -> its
  /completion body, or its stream of {"content", "stop"} lines.
"""
from __future__ import annotations

from fastapi import APIRouter, Depends, Request as HTTPRequest
from fastapi.responses import JSONResponse, Response, StreamingResponse

from serve.api import tokenize as tokens
from serve.api.errors import server_error
from serve.api.infill import fim_tokens, infill_tokens
from serve.api.prompt_tokens import off_loop
from serve.api.text_schema import DetokenizeRequest, InfillRequest, TokenizeRequest
from serve.http.deps import SSE_HEADERS, check_api_key, model_state
from serve.http.run_request import build_request, collect, events, session_of, until_disconnect
from serve.http.sse import data_event as sse
from serve.scheduling.generation import Finished, GenerationError, KeepAlive, Piece
from serve.scheduling.request import Request
from serve.state import ServerState

text = APIRouter(dependencies=[Depends(check_api_key)])
ANSWER_ROOM = 512  # tokens an answer without n_predict keeps when input_extra would fill the context


@text.post("/tokenize")
async def tokenize(body: TokenizeRequest, http: HTTPRequest):
    state = await model_state(http, body.model)
    return await off_loop(tokens.tokenize, state, state.prompt_fit, body)


@text.post("/detokenize")
async def detokenize(body: DetokenizeRequest, http: HTTPRequest):
    return await off_loop(tokens.detokenize, (await model_state(http, body.model)).tokenizer, body.tokens)


@text.post("/infill")
async def infill(body: InfillRequest, http: HTTPRequest):
    state = await model_state(http, body.model)
    prompt = await off_loop(infill_tokens, state, state.prompt_fit, body.input_prefix, body.input_suffix, body.extra(),
                            body.prompt, body.limit() or ANSWER_ROOM)
    # n_predict 0: an editor warming the cache with its context (llama.vim's ring of chunks): the prompt is
    # read (and its blocks kept for the next request), one token drawn and not shown
    warm = body.limit() == 0
    req = build_request(state, body, prompt, 1 if warm else body.limit(), session=session_of(http, body.prompt_cache_key))
    ends = fim_tokens(state.tokenizer).ends
    if ends:
        req.sampling["stop"] = ends
    if body.t_max_predict_ms:  # (0 or less: no limit, as llama-server)
        req.predict_limit_s = body.t_max_predict_ms / 1000
    render = lambda content, fin: shown(body.response_fields, completion_body(  # noqa: E731
        state.settings.model_name, "" if warm else content, fin, predicted=0 if warm else None))
    if body.stream:
        return StreamingResponse(infill_stream(state, req, render, warm), media_type="text/event-stream", headers=SSE_HEADERS)
    return await until_disconnect(http, infill_once(state, req, render))


def shown(fields: list[str] | None, body: dict) -> dict:
    """llama-server's response_fields: only those, each by its path ("timings/prompt_n") as its key."""
    if fields is None:
        return body
    out = {}
    for path in fields:
        value = body
        for key in path.split("/"):
            value = value.get(key) if isinstance(value, dict) else None
        if value is not None:
            out[path] = value
    return out


async def infill_once(state: ServerState, req: Request, render) -> Response:
    try:
        content, fin = await collect(state, req)
    except GenerationError as e:
        return server_error(e.status, str(e)).response()
    return JSONResponse(render(content, fin))


async def infill_stream(state: ServerState, req: Request, render, quiet: bool):
    """llama-server's stream: a {"content", "stop": false} line a piece (none when `quiet`: a warm-up),
    then the whole body's fields with stop true (no [DONE]: that is its OpenAI routes'); keep-alive
    comments while it waits."""
    try:
        async for event in events(state, req):
            if isinstance(event, KeepAlive):
                yield ": keep-alive\n\n"
            elif isinstance(event, Piece) and event.text and not quiet:
                yield sse({"index": 0, "content": event.text, "stop": False})
            elif isinstance(event, Finished):
                yield sse(render("", event))
                return
    except GenerationError as e:
        yield sse(server_error(e.status, str(e)).body())


# ---------------------------------------------------------------- llama-server's /completion body

def completion_body(model: str, content: str, f: Finished, predicted: int | None = None) -> dict:
    """predicted: the tokens to report as predicted (0 for a warm-up, whose one token is not shown)."""
    stop_type = "limit" if f.finish_reason == "length" else "word" if f.stop_sequence else "eos"
    return {"index": 0, "content": content, "tokens": [], "stop": True, "model": model,
            "tokens_predicted": f.completion_tokens if predicted is None else predicted, "tokens_evaluated": f.prompt_tokens,
            "tokens_cached": f.cached_tokens, "stop_type": stop_type, "stopping_word": f.stop_sequence or "",
            "has_new_line": "\n" in content, "truncated": False, "timings": llama_timings(f)}


def llama_timings(f: Finished) -> dict:
    """Strata's timings with llama-server's names beside them (prompt_n: the tokens read, not cached)."""
    read = f.prompt_tokens - f.cached_tokens
    prompt_ms, decode_ms = f.timings.get("prompt_ms"), f.timings.get("decode_ms")
    return f.timings | {"cache_n": f.cached_tokens, "prompt_n": read, "prompt_ms": prompt_ms,
                        "prompt_per_token_ms": _per(prompt_ms, read), "prompt_per_second": _rate(read, prompt_ms),
                        "predicted_n": f.completion_tokens, "predicted_ms": decode_ms,
                        "predicted_per_token_ms": _per(decode_ms, f.completion_tokens),
                        "predicted_per_second": _rate(f.completion_tokens, decode_ms)}


def _per(ms: float | None, n: int) -> float | None:
    return round(ms / n, 3) if ms is not None and n else None


def _rate(n: int, ms: float | None) -> float | None:
    return round(n * 1000 / ms, 2) if ms else None
