"""When a request reached the server: each HTTP request is stamped as it comes in (its headers read, before its body,
the chat template and the tokenizer), in serve/scheduling/request.py's ARRIVAL for the requests made while serving it,
so that their queue wait and time to first token count from the arrival at the server, as docs/DESIGN.md words them,
and `timings.intake_ms` says what the server spent before a request went in line (a burst of 64 clients' 300-word
prompts cost the last of them ~0.4 s of that on a 2-core host: bench/HISTORY.md, twenty-second session)."""
from __future__ import annotations

import time

from serve.scheduling.request import ARRIVAL


class Received:
    """Pure ASGI middleware: ARRIVAL set for each HTTP request while it is served."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        token = ARRIVAL.set(time.monotonic())
        try:
            await self.app(scope, receive, send)
        finally:
            ARRIVAL.reset(token)
