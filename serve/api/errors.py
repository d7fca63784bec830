"""The API's errors: one exception type, rendered in OpenAI's shape, or in Anthropic's on its paths (the
handlers that answer with them: serve/http/error_handlers.py)."""
from __future__ import annotations

from fastapi.responses import JSONResponse

from serve.api import anthropic_schema
from serve.api.openai_schema import error_body

ANTHROPIC_PATHS = "/v1/messages"  # their errors take Anthropic's shape


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


def prompt_too_long(tokens: int | str, ctx: int) -> APIError:
    """tokens: the prompt's length, or what is known of it ("at least N")."""
    # the words Anthropic's API uses, which agents (Claude Code) read to compact their context
    return APIError(400, f"prompt is too long: {tokens} tokens > {ctx - 1} maximum (the context holds {ctx}, "
                         "prompt and completion together)", param="messages", code="context_length_exceeded")


def server_error(status: int, message: str) -> APIError:
    return APIError(status, message, "server_error" if status >= 500 else "invalid_request_error")
