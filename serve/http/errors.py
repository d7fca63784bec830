"""OpenAI-shaped errors: one exception type and the handlers that render every error that way."""
from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from serve.api import anthropic_schema
from serve.api.openai_schema import error_body

ANTHROPIC_PATHS = "/v1/messages"  # their errors take Anthropic's shape
MIB = 1 << 20

log = logging.getLogger("strata.http")


class APIError(Exception):
    def __init__(self, status: int, message: str, type_: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type_, param, code

    def body(self) -> dict:
        return error_body(self.message, self.type, self.param, self.code)

    def response(self, path: str = "") -> JSONResponse:
        if path.startswith(ANTHROPIC_PATHS):
            return JSONResponse(anthropic_schema.error_body(self.message, anthropic_schema.error_type(self.status)),
                                status_code=self.status)
        return JSONResponse(self.body(), status_code=self.status)


class QueueFull(APIError):
    """--max-queue requests already wait: refused at once rather than left to hang. OpenAI's clients
    get 429 with Retry-After; Anthropic's 529 overloaded_error, which its clients retry."""

    RETRY_AFTER_S = 1

    def __init__(self, waiting: int):
        super().__init__(429, f"the server is overloaded: {waiting} requests are already waiting (--max-queue); "
                              "try again shortly", "rate_limit_error", code="rate_limit_exceeded")

    def response(self, path: str = "") -> JSONResponse:
        if path.startswith(ANTHROPIC_PATHS):
            return JSONResponse(anthropic_schema.error_body(self.message, "overloaded_error"), status_code=529)
        return JSONResponse(self.body(), status_code=429, headers={"Retry-After": str(self.RETRY_AFTER_S)})


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


def prompt_too_long(tokens: int | str, ctx: int) -> APIError:
    """tokens: the prompt's length, or what is known of it ("at least N")."""
    # the words Anthropic's API uses, which agents (Claude Code) read to compact their context
    return APIError(400, f"prompt is too long: {tokens} tokens > {ctx - 1} maximum (the context holds {ctx}, "
                         "prompt and completion together)", param="messages", code="context_length_exceeded")


def server_error(status: int, message: str) -> APIError:
    return APIError(status, message, "server_error" if status >= 500 else "invalid_request_error")


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
