"""Running one request: its checks and limits (shared by every endpoint), its events, and
cancelling it when the client leaves."""
from __future__ import annotations

import asyncio
import hashlib
import secrets

from fastapi import Request as HTTPRequest
from fastapi.responses import Response

from serve.api import openai_schema as schema
from serve.api.errors import APIError, QueueFull
from serve.scheduling.generation import Finished, GenerationError, Piece, generate
from serve.scheduling.request import Request
from serve.state import ServerState


SESSION_HEADERS = ("session_id", "x-session-id", "conversation_id", "x-claude-code-session-id")


def session_of(http: HTTPRequest, key: str | None) -> str | None:
    """The client's session, if it names one: the body's key (OpenAI's prompt_cache_key, Anthropic's
    metadata.user_id), else a session header (Codex sends session_id), as a short digest for GEN."""
    key = key or next((http.headers[h] for h in SESSION_HEADERS if http.headers.get(h)), None)
    return hashlib.blake2b(key.encode(), digest_size=8).hexdigest() if key else None


def build_request(state: ServerState, body: schema.SamplingFields, prompt: list[int],
                  max_tokens: int | None, grammar: str | None = None, session: str | None = None) -> Request:
    """grammar: what the output must match (serve/api/constraints.py), carried to the engine on GEN;
    session: the client's (session_of), whose cached prefix the engine evicts last."""
    ctx = state.ctx
    waiting = len(state.scheduler.waiting)
    if state.settings.max_queue and waiting >= state.settings.max_queue:
        raise QueueFull(waiting)
    if not prompt:
        raise APIError(400, "the prompt is empty", param="prompt")
    if len(prompt) >= ctx:
        # the words Anthropic's API uses, which agents (Claude Code) read to compact their context
        raise APIError(400, f"prompt is too long: {len(prompt)} tokens > {ctx - 1} maximum (the context holds "
                            f"{ctx}, prompt and completion together)", param="messages", code="context_length_exceeded")
    room = ctx - len(prompt)
    if max_tokens is not None and max_tokens <= 0:
        raise APIError(400, f"max_tokens must be >= 1, got {max_tokens}", param="max_tokens")
    if max_tokens is not None and max_tokens > ctx:
        raise APIError(400, f"max_tokens {max_tokens} exceeds the context of {ctx} tokens", param="max_tokens")
    sampling = state.settings.sampling | body.gen_params() | ({"grammar": grammar} if grammar else {}) | (
        {"session": session} if session else {})
    if sampling["temperature"] > 0:  # seeded here, so that a restarted engine continues the same stream
        sampling.setdefault("seed", secrets.randbits(63))
    return Request(prompt=prompt, max_tokens=min(max_tokens or room, room), sampling=sampling,
                   stop=body.stop_strings(), stream=body.stream, priority=body.priority)


def events(state: ServerState, req: Request):
    return generate(req, state.scheduler, state.tokenizer, state.metrics, state.settings.keepalive_s)


async def deltas(state: ServerState, req: Request, output):
    """A streamed answer as its consumer sees it: keep-alives while it waits, the chat deltas of each
    piece (output: serve/api/chat.py ChatOutput, which splits reasoning and tool calls off), and at the
    end the last deltas, then the Finished. A piece's tokens with log-probabilities ride on its first
    delta ("logprobs": their T lines), or the next piece's if a tag held its text back."""
    held: list = []
    async for event in events(state, req):
        if isinstance(event, Piece):
            held += event.logprobs
            for delta in output.feed(event.text):
                if held:
                    delta, held = delta | {"logprobs": held}, []
                yield delta
        elif isinstance(event, Finished):
            for delta in output.feed("", end=True, stopped=event.finish_reason == "stop"):
                yield delta
            yield event
            return
        else:
            yield event


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
