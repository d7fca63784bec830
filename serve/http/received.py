"""When a request reached the server: each HTTP request's scope is stamped as it comes in (its headers read, before
its body, the chat template and the tokenizer), so that a request's queue wait and time to first token count from its
arrival at the server, as docs/DESIGN.md words them, and `timings.intake_ms` says what the server spent before the
request went in line (a burst of 64 clients' 300-word prompts cost the last of them ~0.4 s of that on a 2-core host:
bench/HISTORY.md, twenty-second session)."""
from __future__ import annotations

import time

from starlette.requests import Request as HTTPRequest

KEY = "strata.received"


class Received:
    """Pure ASGI middleware: scope[KEY] = time.monotonic() for HTTP requests."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            scope[KEY] = time.monotonic()
        await self.app(scope, receive, send)


def received_at(http: HTTPRequest) -> float | None:
    return http.scope.get(KEY)
