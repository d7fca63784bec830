"""What every route depends on: the server's state (the first model's, or the one a request names),
the API key check, the headers of a server-sent event stream."""
from __future__ import annotations

import secrets

from fastapi import Request as HTTPRequest

from serve.api.errors import APIError
from serve.state import ServerState

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def state_of(http: HTTPRequest) -> ServerState:
    """The first model's state: what the server reports as a whole (health, status, metrics)."""
    return http.app.state.strata


async def model_state(http: HTTPRequest, name: str | None) -> ServerState:
    """The state of the model a request names (serve/model_set.py), loaded first if need be."""
    return await http.app.state.models.state_for(name)


def watched_state(http: HTTPRequest, name: str) -> ServerState:
    """The state of a loaded model a live view names, not loading it (serve/model_set.py watched_state)."""
    return http.app.state.models.watched_state(name)


def check_api_key(http: HTTPRequest) -> None:
    """--api-key: as OpenAI clients send it (Authorization: Bearer) or Anthropic's (x-api-key)."""
    key = state_of(http).settings.api_key
    if key is None:
        return
    bearer = http.headers.get("authorization", "")
    given = bearer[7:] if bearer.startswith("Bearer ") else http.headers.get("x-api-key")
    if given is None or not secrets.compare_digest(given.encode(), key.encode()):
        raise APIError(401, "invalid or missing API key (send Authorization: Bearer <key>, or x-api-key: <key>)",
                       code="invalid_api_key")
