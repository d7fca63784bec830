"""POST /v1/embeddings, OpenAI's: each input is a request of its own in the scheduler (GEN embed=1), read
by the engine like any prompt, in steps shared with every other read and decode, parkable, and answered
with its pooled hidden state (engine/runner/pooling.py) instead of tokens; the vectors come back
L2-normalised in the input's order (serve/api/embeddings_schema.py). A client that leaves cancels them all.
"""
from __future__ import annotations

import asyncio

from fastapi import APIRouter, Depends, Request as HTTPRequest
from fastapi.responses import JSONResponse

from serve.api.embeddings_schema import EmbeddingRequest, check_dimensions, embeddings_body, input_tokens
from serve.api.errors import QueueFull, server_error
from serve.api.prompt_tokens import off_loop
from serve.http.deps import check_api_key, model_state
from serve.http.run_request import until_disconnect
from serve.scheduling.generation import GenerationError, embedding
from serve.scheduling.request import Request
from serve.state import ServerState

embeddings = APIRouter(prefix="/v1", dependencies=[Depends(check_api_key)])


@embeddings.post("/embeddings")
async def create_embeddings(body: EmbeddingRequest, http: HTTPRequest):
    state = await model_state(http, body.model)
    width = state.engine.info.fields.get("dim")
    check_dimensions(body.dimensions, int(width) if width and width.isdigit() else None)
    prompts = await off_loop(input_tokens, state, state.prompt_fit, body)
    waiting = len(state.scheduler.waiting)
    if state.settings.max_queue and waiting + len(prompts) > state.settings.max_queue:
        raise QueueFull(waiting)
    reqs = [Request(prompt=prompt, max_tokens=1, sampling={"embed": 1}) for prompt in prompts]
    return await until_disconnect(http, respond(state, body, reqs))


async def respond(state: ServerState, body: EmbeddingRequest, reqs: list[Request]):
    tasks = [asyncio.ensure_future(embedding(req, state.scheduler, state.metrics)) for req in reqs]
    try:
        vectors = await asyncio.gather(*tasks)
    except GenerationError as e:
        return server_error(e.status, str(e)).response()
    finally:  # one failed, or the client left: the others are cancelled (which frees the engine of them)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return JSONResponse(embeddings_body(vectors, body, state.settings.model_name, sum(len(r.prompt) for r in reqs)))
