"""--max-body-mb: a request body over the limit is refused with 413 before it is read whole.

A declared Content-Length over the limit is refused at once, before a byte of the body is read (a
client that sent `Expect: 100-continue` gets no 100 and need not send it). A chunked body declares
no length: its bytes are counted as the route reads them, and the reading stops at the limit. Either
way the server holds at most the limit of any body, so its memory stays flat whatever is sent.
Uvicorn then reads the rest of the unread body and drops it, keeping the connection, so the client
reads the 413 instead of a connection reset. A pure ASGI middleware: Starlette's
BaseHTTPMiddleware runs the app in a task behind its own streams, which this does not need.
"""
from __future__ import annotations

import logging

from serve.http.error_handlers import MIB, BodyTooLarge

# The default limit, from the context: a context's worth of prompt as JSON, with room. Prose is about
# 4 bytes a token; JSON's escapes (\n, \", and \uXXXX, 6 bytes for a non-ASCII character that is
# often a token of its own) and what a body carries beside the prompt (tool schemas, ids, earlier
# turns' thinking that is not replayed to the model) stay well within 16 bytes a token. A 1M-token
# context so takes 16 MiB; 128K tokens, 2 MiB.
BYTES_PER_CONTEXT_TOKEN = 16
# and never less than 4 MiB, so that a small context's model still takes an agent's large tool set
# or a pasted file: the prompt check (serve/api/prompt_fit.py) then measures the text exactly
DEFAULT_FLOOR_BYTES = 4 * MIB

log = logging.getLogger("strata.http")


def body_limit_bytes(max_body_mb: float | None, ctx: int) -> int | None:
    """--max-body-mb in bytes (MiB: 2^20 bytes each), sized from the context when not given; None
    when it is 0 or less: no limit."""
    if max_body_mb is None:
        return max(DEFAULT_FLOOR_BYTES, BYTES_PER_CONTEXT_TOKEN * ctx)
    return int(max_body_mb * MIB) if max_body_mb > 0 else None


def declared_length(scope) -> int | None:
    """The request's Content-Length (uvicorn has already refused a malformed one)."""
    value = next((v for k, v in scope.get("headers", ()) if k == b"content-length"), None)
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


class BodyLimit:
    """ASGI middleware: 413 for a request body of more than limit_bytes (None: no limit)."""

    def __init__(self, app, limit_bytes: int | None):
        self.app, self.limit = app, limit_bytes

    async def __call__(self, scope, receive, send):
        if self.limit is None or scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = declared_length(scope)
        if declared is not None and declared > self.limit:
            return await self.refuse(scope, receive, send, declared)
        await self.app(scope, self.counted(receive), send)

    async def refuse(self, scope, receive, send, declared: int) -> None:
        """413 on the declared length alone: the body is never read."""
        too_large = BodyTooLarge(self.limit)
        log.warning("%s %s -> 413: Content-Length %d: %s", scope["method"], scope["path"], declared, too_large.detail)
        await too_large.error().response(scope["path"])(scope, receive, send)

    def counted(self, receive):
        """receive, raising BodyTooLarge once the body read so far is over the limit. It is raised inside
        the route's reading of the body, where the app's handler answers it (serve/api/errors.py)."""
        read = 0

        async def receive_counted():
            nonlocal read
            message = await receive()
            if message["type"] == "http.request":
                read += len(message.get("body", b""))
                if read > self.limit:
                    raise BodyTooLarge(self.limit)
            return message

        return receive_counted
