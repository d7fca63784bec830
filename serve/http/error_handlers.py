"""The handlers that answer every error in the API's shape (serve/api/errors.py): the API's own, FastAPI's
validation errors, Starlette's, and a body over --max-body-mb."""
from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from serve.api.errors import APIError, server_error

MIB = 1 << 20

log = logging.getLogger("strata.http")


class BodyTooLarge(StarletteHTTPException):
    """A request body over --max-body-mb (serve/http/body_limit.py). Raised while the body streams in, from
    inside the route's reading of it, so it is an HTTPException: FastAPI passes those through its body
    parsing (any other exception there becomes a 400), and the handler below answers it."""

    def __init__(self, limit_bytes: int):
        mib = limit_bytes / MIB
        super().__init__(413, f"the request body is larger than this server's limit of {mib:g} MiB "
                              f"(--max-body-mb {mib:g}): send a shorter request, or start the server with a "
                              "higher --max-body-mb")

    def error(self) -> APIError:
        return APIError(413, self.detail, code="request_too_large")


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError):
        log.warning("%s %s -> %d: %s", request.method, request.url.path, exc.status, exc.message)
        return exc.response(request.url.path)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError):
        first = exc.errors()[0] if exc.errors() else {"msg": "invalid request", "loc": ()}
        loc = [str(x) for x in first.get("loc", ()) if x != "body"]
        param = ".".join(loc) or None
        message = f"{param}: {first['msg']}" if param else first["msg"]
        if first.get("type") == "json_invalid":
            param = None
            message = f"malformed JSON body: {first.get('ctx', {}).get('error', first['msg'])}"
        log.warning("%s %s -> 400: %s", request.method, request.url.path, message)
        return APIError(400, message, param=param).response(request.url.path)

    @app.exception_handler(BodyTooLarge)
    async def _body_too_large(request: Request, exc: BodyTooLarge):
        log.warning("%s %s -> 413: %s", request.method, request.url.path, exc.detail)
        return exc.error().response(request.url.path)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException):
        return server_error(exc.status_code, str(exc.detail)).response(request.url.path)
