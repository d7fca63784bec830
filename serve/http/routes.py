"""HTTP routes: OpenAI endpoints under /v1 (optional Bearer auth), health, status, metrics."""
from __future__ import annotations

from dataclasses import dataclass
from typing import AsyncIterator, Callable

from fastapi import APIRouter, Depends, FastAPI, Request as HTTPRequest
from fastapi.responses import JSONResponse, Response, StreamingResponse

from serve.api import anthropic_schema
from serve.http import messages_api
from serve.http import responses_api
from serve.api import responses_schema
from serve.api import openai_schema as schema
from serve.api.chat import ChatOutput, reasoning_opened, tool_plan
from serve.api.constraints import grammar_for
from serve.http.deps import SSE_HEADERS, check_api_key, model_state, state_of
from serve.api.errors import server_error
from serve.api.infill import fim_tokens, infill_tokens
from serve.api.logprobs import chat_logprobs, completion_logprobs
from serve.scheduling.metrics import ModelsMetrics
from serve.scheduling.generation import Finished, GenerationError, KeepAlive, Piece
from serve.api.prompt_fit import PromptFit
from serve.api.prompt_tokens import chat_tokens, check_ids, off_loop, text_tokens
from serve.scheduling.request import Request
from serve.http.choices import merged, siblings
from serve.http.run_request import build_request, session_of, until_disconnect
from serve.http.sse import data_event as sse
from serve.state import ServerState

v1 = APIRouter(prefix="/v1", dependencies=[Depends(check_api_key)])
ops = APIRouter()


async def completion_prompt(state: ServerState, fit: PromptFit, body: schema.CompletionRequest) -> list[int]:
    """The prompt's tokens: as given, the text's, or with a suffix, the fill-in-the-middle prompt around them."""
    if isinstance(body.prompt, list) and body.prompt and isinstance(body.prompt[0], int):
        check_ids(body.prompt, state.tokenizer.vocab_size, "prompt", param="prompt")
        return list(body.prompt)
    text = body.prompt if isinstance(body.prompt, str) else body.prompt[0]
    if body.suffix is not None:
        return await off_loop(infill_tokens, state, fit, text, body.suffix, [], "")
    return await off_loop(text_tokens, state, fit, text)


def as_choice(chunk: dict, i: int) -> dict:
    """A chunk or body of one answer as choice i's."""
    return chunk | {"choices": [c | {"index": i} for c in chunk["choices"]]}


async def stream_choices(state: ServerState, reqs: list[Request], shapes: list["Shape"], rid: str, model: str,
                         include_usage: bool) -> AsyncIterator[str]:
    """The answers' chunks as they come, each marked with its choice; each answer's last chunk carries
    its timings; then the usage of them all (if asked) and [DONE]."""
    for i, shape in enumerate(shapes):
        for chunk in shape.first(rid, model):
            yield sse(as_choice(chunk, i))
    ends: list[Finished] = []
    try:
        async for i, event in merged(state, reqs):
            if isinstance(event, KeepAlive):
                yield ": keep-alive\n\n"
                continue
            if isinstance(event, Piece):
                chunks = shapes[i].pieces(rid, model, event)
            else:
                chunks, ends = shapes[i].last(rid, model, event), ends + [event]
                chunks[-1] |= {"timings": event.timings}
            for chunk in chunks:
                yield sse(as_choice(chunk, i))
    except GenerationError as e:
        yield sse(server_error(e.status, str(e)).body())
        return
    if include_usage:
        yield sse(schema.usage_chunk(rid, model, shapes[0].chunk_object, ends[0].prompt_tokens,
                                     sum(f.completion_tokens for f in ends), ends[0].cached_tokens))
    yield sse("[DONE]")


async def whole_choices(state: ServerState, reqs: list[Request], shapes: list["Shape"], rid: str, model: str) -> dict:
    """Every answer whole, as one body: its choices in order, the usage of them all (the prompt once),
    the first answer's timings."""
    texts, ends = [[] for _ in reqs], [None] * len(reqs)
    async for i, event in merged(state, reqs):
        if isinstance(event, Piece):
            texts[i].append(event.text)
        elif isinstance(event, Finished):
            ends[i] = event
    bodies = [shape.body(rid, model, "".join(text), f) for shape, text, f in zip(shapes, texts, ends)]
    completion = sum(f.completion_tokens for f in ends)
    return bodies[0] | {"choices": [as_choice(b, i)["choices"][0] for i, b in enumerate(bodies)],
                        "usage": schema.usage(ends[0].prompt_tokens, completion, ends[0].cached_tokens)}


# ---------------------------------------------------------------- endpoints

@dataclass(frozen=True)
class Shape:
    """How one endpoint renders its results: the whole body; a stream's start, its chunks for a
    piece of text, and its last chunks."""

    prefix: str
    chunk_object: str
    body: Callable[[str, str, str, Finished], dict]
    pieces: Callable[[str, str, Piece], list[dict]]
    last: Callable[[str, str, Finished], list[dict]]
    first: Callable[[str, str], list[dict]]


def chat_shape(opened: bool | None, plan, tokenizer, logprobs: bool) -> Shape:
    """Chat bodies and chunks (serve/api/chat.py ChatOutput: reasoning and tool calls split from the
    content; each stream keeps its own, as a tag may arrive cut across pieces). With logprobs, each
    piece's tokens ride on its first chunk (or the next one, if a tag holds the piece's text back)."""
    stream, held = ChatOutput(opened, plan), []

    def scored(tokens: list) -> dict | None:
        held.extend(tokens)
        out = chat_logprobs(tokenizer, held) if held and logprobs else None
        held.clear()
        return out

    def pieces(rid: str, model: str, piece: Piece) -> list[dict]:
        deltas = stream.feed(piece.text)
        if not deltas:
            held.extend(piece.logprobs)
        return [schema.chat_chunk(rid, model, d, logprobs=scored(piece.logprobs) if i == 0 else None)
                for i, d in enumerate(deltas)]

    def last(rid: str, model: str, f: Finished) -> list[dict]:
        tail = [schema.chat_chunk(rid, model, d) for d in stream.feed("", end=True, stopped=f.finish_reason == "stop")]
        return tail + [schema.chat_chunk(rid, model, {}, stream.finish_reason(f.finish_reason), logprobs=scored([]))]

    def body(rid: str, model: str, text: str, f: Finished) -> dict:
        whole = ChatOutput(opened, plan)
        message = whole.message(text, f.finish_reason)
        return schema.chat_body(rid, model, message, whole.finish_reason(f.finish_reason), f.prompt_tokens,
                                f.completion_tokens, f.timings, f.cached_tokens,
                                chat_logprobs(tokenizer, f.logprobs) if logprobs else None)

    return Shape("chatcmpl", "chat.completion.chunk", body=body, pieces=pieces, last=last,
                 first=lambda rid, model: [schema.chat_chunk(rid, model, {"role": "assistant", "content": ""})])


def completion_shape(tokenizer, logprobs: bool, echo: str) -> Shape:
    """Completion bodies and chunks; `echo`: the prompt's text, written before the answer's. With
    logprobs, each chunk's tokens and where their text starts in the whole text; echoed, the prompt's
    tokens first (the first without a log-probability), so a stream's echo waits for the prompt's read."""
    written, echo_due = [len(echo)], [bool(echo)]  # characters before the next chunk's; the echo not yet sent

    def echoed(rid: str, model: str, prompt_scores: list) -> list[dict]:
        if not echo_due[0]:
            return []
        echo_due[0] = False
        return [schema.completion_chunk(rid, model, echo,
                                        logprobs=completion_logprobs(tokenizer, prompt_scores) if logprobs else None)]

    def pieces(rid: str, model: str, piece: Piece) -> list[dict]:
        scored = completion_logprobs(tokenizer, piece.logprobs, written[0]) if logprobs else None
        written[0] += len(piece.text)
        return echoed(rid, model, piece.prompt_logprobs) + [schema.completion_chunk(rid, model, piece.text,
                                                                                    logprobs=scored)]

    def body(rid: str, model: str, text: str, f: Finished) -> dict:
        scored = completion_logprobs(tokenizer, f.prompt_logprobs + f.logprobs) if logprobs else None
        return schema.completion_body(rid, model, echo + text, f.finish_reason, f.prompt_tokens, f.completion_tokens,
                                      f.timings, f.cached_tokens, scored)

    return Shape("cmpl", "text_completion", body=body, pieces=pieces,
                 last=lambda rid, model, f: echoed(rid, model, f.prompt_logprobs)
                 + [schema.completion_chunk(rid, model, "", f.finish_reason)],
                 first=lambda rid, model: [] if logprobs else echoed(rid, model, []))


async def respond(http: HTTPRequest, state: ServerState, req: Request, body: schema.SamplingFields,
                  shape: Callable[[], Shape]) -> Response:
    """The answer, or body.n of them (serve/http/choices.py): shape() makes each one's renderer."""
    reqs = siblings(req, body.n)
    shapes = [shape() for _ in reqs]
    rid, model = f"{shapes[0].prefix}-{req.id}", state.settings.model_name
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return StreamingResponse(stream_choices(state, reqs, shapes, rid, model, include_usage),
                                 media_type="text/event-stream", headers=SSE_HEADERS)

    async def work():
        try:
            return JSONResponse(await whole_choices(state, reqs, shapes, rid, model))
        except GenerationError as e:
            return server_error(e.status, str(e)).response()

    return await until_disconnect(http, work())


@v1.post("/chat/completions")
async def chat_completions(body: schema.ChatCompletionRequest, http: HTTPRequest):
    state = await model_state(http, body.model)
    plan = tool_plan(state, body)
    text, prompt = await off_loop(chat_tokens, state, state.prompt_fit, body, plan)
    grammar = grammar_for(state, plan, body)
    req = build_request(state, body, prompt, body.max_completion_tokens or body.max_tokens,
                        grammar, session_of(http, body.prompt_cache_key))
    opened = reasoning_opened(state, text)
    return await respond(http, state, req, body, lambda: chat_shape(opened, plan, state.tokenizer, body.logprobs))


@v1.post("/completions")
async def completions(body: schema.CompletionRequest, http: HTTPRequest):
    state = await model_state(http, body.model)
    prompt = await completion_prompt(state, state.prompt_fit, body)
    req = build_request(state, body, prompt, body.max_tokens, session=session_of(http, body.prompt_cache_key))
    if body.suffix is not None and (ends := fim_tokens(state.tokenizer).ends):  # a padding or a new file ends it
        req.sampling["stop"] = ends
    echo = state.tokenizer.decode(prompt) if body.echo else ""
    return await respond(http, state, req, body, lambda: completion_shape(state.tokenizer, body.logprobs is not None, echo))


@v1.post("/messages")
async def anthropic_messages(body: anthropic_schema.MessagesRequest, http: HTTPRequest):
    """Anthropic's Messages API (`?beta=true`, as Claude Code sends it, is accepted and ignored)."""
    state = await model_state(http, body.model)
    return await messages_api.respond(http, state, body, state.prompt_fit)


@v1.post("/responses")
async def responses(body: responses_schema.ResponsesRequest, http: HTTPRequest):
    """OpenAI's Responses API (Codex CLI's), over the chat machinery (serve/http/responses_api.py)."""
    state = await model_state(http, body.model)
    return await responses_api.respond(http, state, state.responses, body, state.prompt_fit)


@v1.post("/messages/count_tokens")
async def anthropic_count_tokens(body: anthropic_schema.CountTokensRequest, http: HTTPRequest):
    return await off_loop(messages_api.count_tokens, await model_state(http, body.model), body)


@v1.get("/models")
async def models(http: HTTPRequest):
    """Every model the server answers for, each saying whether it is loaded now."""
    return {"object": "list", "data": http.app.state.models.listing()}


@ops.get("/health")
async def health(http: HTTPRequest):
    state = state_of(http)
    error = state.failure
    return JSONResponse({"status": state.health} | ({"error": error} if error else {}),
                        status_code=200 if state.ready else 503)


@ops.get("/status")
async def status(http: HTTPRequest):
    state = state_of(http)
    return state.scheduler.status() | {"engine": state.engine.state.value, "engine_info": state.engine.info.fields,
                                       "event_streams": state.event_streams, "models": http.app.state.models.listing()}


@ops.get("/metrics")
async def metrics(http: HTTPRequest):
    """The server's metrics; with several models (serve/model_set.py), every loaded one's, each sample
    labelled with its model's name (an unloaded model's counts go with it)."""
    models = http.app.state.models
    if len(models.entries) == 1:
        return Response(state_of(http).metrics.render(), media_type="text/plain; version=0.0.4")
    named = {e.name: e.state.metrics for e in models.entries.values() if e.state is not None}
    return Response(ModelsMetrics(named).render(), media_type="text/plain; version=0.0.4")


def include_routes(app: FastAPI) -> None:
    from serve.http.embeddings_api import embeddings
    from serve.http.events_api import events  # they read this module's helpers
    from serve.http.gateway_api import gateway
    from serve.http.text_api import text

    app.include_router(v1)
    app.include_router(ops)
    app.include_router(gateway)
    app.include_router(events)
    app.include_router(embeddings)
    app.include_router(text)
