"""HTTP routes: OpenAI endpoints under /v1 (optional Bearer auth), health, status, metrics."""
from __future__ import annotations

import asyncio
import json
import secrets
from dataclasses import dataclass
from typing import AsyncIterator, Callable

from fastapi import APIRouter, Depends, FastAPI, Request as HTTPRequest
from fastapi.responses import JSONResponse, Response, StreamingResponse

from serve import openai_schema as schema
from serve.errors import APIError, server_error
from serve.generation import Finished, GenerationError, KeepAlive, Piece, generate
from serve.chat import ChatOutput, reasoning_opened, render, tool_plan
from serve.request import Request
from serve.state import ServerState

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def state_of(http: HTTPRequest) -> ServerState:
    return http.app.state.strata


def check_api_key(http: HTTPRequest) -> None:
    key = state_of(http).settings.api_key
    if key is None:
        return
    given = http.headers.get("authorization", "")
    if not given.startswith("Bearer ") or not secrets.compare_digest(given[7:].encode(), key.encode()):
        raise APIError(401, "invalid or missing API key (send Authorization: Bearer <key>)", code="invalid_api_key")


v1 = APIRouter(prefix="/v1", dependencies=[Depends(check_api_key)])
ops = APIRouter()


# ---------------------------------------------------------------- building a request

def build_request(state: ServerState, body: schema.SamplingFields, prompt: list[int],
                  max_tokens: int | None) -> Request:
    ctx = state.ctx
    if not prompt:
        raise APIError(400, "the prompt is empty", param="prompt")
    if len(prompt) >= ctx:
        raise APIError(400, f"the prompt has {len(prompt)} tokens; the context holds {ctx} "
                            f"(prompt and completion together)", param="messages", code="context_length_exceeded")
    room = ctx - len(prompt)
    if max_tokens is not None and max_tokens <= 0:
        raise APIError(400, f"max_tokens must be >= 1, got {max_tokens}", param="max_tokens")
    if max_tokens is not None and max_tokens > ctx:
        raise APIError(400, f"max_tokens {max_tokens} exceeds the context of {ctx} tokens", param="max_tokens")
    if any(t < 0 or t >= state.tokenizer.vocab_size for t in prompt):
        raise APIError(400, "prompt token ids must be within the vocabulary", param="prompt")
    sampling = body.gen_params()
    if sampling["temperature"] > 0:  # seeded here, so that a restarted engine continues the same stream
        sampling.setdefault("seed", secrets.randbits(63))
    return Request(prompt=prompt, max_tokens=min(max_tokens or room, room), sampling=sampling,
                   stop=body.stop_strings(), stream=body.stream)


def completion_prompt(state: ServerState, body: schema.CompletionRequest) -> list[int]:
    if isinstance(body.prompt, list) and body.prompt and isinstance(body.prompt[0], int):
        return list(body.prompt)
    text = body.prompt if isinstance(body.prompt, str) else body.prompt[0]
    return state.tokenizer.encode(text)


# ---------------------------------------------------------------- running it

def events(state: ServerState, req: Request):
    return generate(req, state.scheduler, state.tokenizer, state.metrics, state.settings.keepalive_s)


async def collect(state: ServerState, req: Request) -> tuple[str, Finished]:
    parts: list[str] = []
    async for event in events(state, req):
        if isinstance(event, Piece):
            parts.append(event.text)
        elif isinstance(event, Finished):
            return "".join(parts), event
    raise GenerationError("the request ended without a result", 500)


async def until_disconnect(http: HTTPRequest, work):
    """Run `work`; cancel it if the client disconnects first (cancellation frees the engine)."""
    task = asyncio.ensure_future(work)

    async def watch():
        while (await http.receive())["type"] != "http.disconnect":
            pass

    watcher = asyncio.ensure_future(watch())
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
            # wait for the cancellation to finish: it is what frees the engine (and a task the
            # loop holds only weakly could otherwise be collected before it runs)
            await asyncio.gather(task, return_exceptions=True)
    if task.cancelled():
        return Response(status_code=499)
    return task.result()


def sse(data: dict | str) -> str:
    return f"data: {data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)}\n\n"


async def stream_events(state: ServerState, req: Request, on_piece: Callable[[str], list[dict]],
                        on_finish: Callable[[Finished], list[dict]], first: list[dict]) -> AsyncIterator[str]:
    for chunk in first:
        yield sse(chunk)
    try:
        async for event in events(state, req):
            if isinstance(event, KeepAlive):
                yield ": keep-alive\n\n"
            elif isinstance(event, Piece):
                for chunk in on_piece(event.text):
                    yield sse(chunk)
            elif isinstance(event, Finished):
                for chunk in on_finish(event):
                    yield sse(chunk)
                yield sse("[DONE]")
                return
    except GenerationError as e:
        yield sse(server_error(e.status, str(e)).body())


def run_stream(state, req, on_piece, on_finish, first: list[dict]) -> StreamingResponse:
    return StreamingResponse(stream_events(state, req, on_piece, on_finish, first),
                             media_type="text/event-stream", headers=SSE_HEADERS)


async def run_once(http: HTTPRequest, state: ServerState, req: Request, render) -> Response:
    async def work():
        try:
            text, fin = await collect(state, req)
        except GenerationError as e:
            return server_error(e.status, str(e)).response()
        return JSONResponse(render(text, fin))

    return await until_disconnect(http, work())


# ---------------------------------------------------------------- endpoints

@dataclass(frozen=True)
class Shape:
    """How one endpoint renders its results: the whole body; a stream's start, its chunks for a
    piece of text, and its last chunks."""

    prefix: str
    chunk_object: str
    body: Callable[[str, str, str, Finished], dict]
    pieces: Callable[[str, str, str], list[dict]]
    last: Callable[[str, str, Finished], list[dict]]
    first: Callable[[str, str], list[dict]]


def chat_shape(opened: bool | None, plan) -> Shape:
    """Chat bodies and chunks (serve/chat.py ChatOutput: reasoning and tool calls split from the
    content; each stream keeps its own, as a tag may arrive cut across pieces)."""
    stream = ChatOutput(opened, plan)

    def pieces(rid: str, model: str, text: str) -> list[dict]:
        return [schema.chat_chunk(rid, model, delta) for delta in stream.feed(text)]

    def last(rid: str, model: str, f: Finished) -> list[dict]:
        tail = [schema.chat_chunk(rid, model, d) for d in stream.feed("", end=True, stopped=f.finish_reason == "stop")]
        return tail + [schema.chat_chunk(rid, model, {}, stream.finish_reason(f.finish_reason))]

    def body(rid: str, model: str, text: str, f: Finished) -> dict:
        whole = ChatOutput(opened, plan)
        message = whole.message(text, f.finish_reason)
        return schema.chat_body(rid, model, message, whole.finish_reason(f.finish_reason), f.prompt_tokens,
                                f.completion_tokens, f.timings)

    return Shape("chatcmpl", "chat.completion.chunk", body=body, pieces=pieces, last=last,
                 first=lambda rid, model: [schema.chat_chunk(rid, model, {"role": "assistant", "content": ""})])


COMPLETION = Shape(
    "cmpl", "text_completion",
    body=lambda rid, model, text, f: schema.completion_body(rid, model, text, f.finish_reason, f.prompt_tokens,
                                                            f.completion_tokens, f.timings),
    pieces=lambda rid, model, text: [schema.completion_chunk(rid, model, text)],
    last=lambda rid, model, f: [schema.completion_chunk(rid, model, "", f.finish_reason)],
    first=lambda rid, model: [])


async def respond(http: HTTPRequest, state: ServerState, req: Request, body: schema.SamplingFields,
                  shape: Shape) -> Response:
    rid, model = f"{shape.prefix}-{req.id}", state.settings.model_name
    if not body.stream:
        return await run_once(http, state, req, lambda text, f: shape.body(rid, model, text, f))
    include_usage = bool(body.stream_options and body.stream_options.include_usage)

    def finish(f: Finished) -> list[dict]:
        last = shape.last(rid, model, f)
        last[-1] |= {"timings": f.timings}
        return last + ([schema.usage_chunk(rid, model, shape.chunk_object, f.prompt_tokens, f.completion_tokens)]
                       if include_usage else [])

    return run_stream(state, req, lambda text: shape.pieces(rid, model, text), finish, shape.first(rid, model))


@v1.post("/chat/completions")
async def chat_completions(body: schema.ChatCompletionRequest, http: HTTPRequest):
    state = state_of(http)
    plan = tool_plan(state, body)
    text = render(state, body, plan)
    req = build_request(state, body, state.tokenizer.encode(text), body.max_completion_tokens or body.max_tokens)
    return await respond(http, state, req, body, chat_shape(reasoning_opened(state, text), plan))


@v1.post("/completions")
async def completions(body: schema.CompletionRequest, http: HTTPRequest):
    state = state_of(http)
    req = build_request(state, body, completion_prompt(state, body), body.max_tokens)
    return await respond(http, state, req, body, COMPLETION)


@v1.get("/models")
async def models(http: HTTPRequest):
    state = state_of(http)
    return {"object": "list", "data": [{"id": state.settings.model_name, "object": "model",
                                        "created": state.started_at, "owned_by": "strata"}]}


@ops.get("/health")
async def health(http: HTTPRequest):
    engine = state_of(http).engine
    body = {"status": "ok" if engine.ready else engine.state.value}
    return JSONResponse(body, status_code=200 if engine.ready else 503)


@ops.get("/status")
async def status(http: HTTPRequest):
    state = state_of(http)
    return state.scheduler.status() | {"engine": state.engine.state.value, "engine_info": state.engine.info.fields}


@ops.get("/metrics")
async def metrics(http: HTTPRequest):
    return Response(state_of(http).metrics.render(), media_type="text/plain; version=0.0.4")


def include_routes(app: FastAPI) -> None:
    app.include_router(v1)
    app.include_router(ops)
