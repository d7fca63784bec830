"""Cross-origin requests refused unless --cors-origin names their origin.

A page open in the user's browser may send requests to this server from its own origin: a
"simple" POST needs no preflight, so without this check any site could make the local model
generate. The browser names the sending page in the Origin header: a request that carries one,
from an origin other than the server's own, gets 403 before routing; the origins the user named
(or `*`) get CORS headers and answered preflights (Starlette's CORSMiddleware). Requests without
an Origin (curl, the SDKs, a gateway) and the server's own page pass untouched.
"""
from __future__ import annotations

import logging

from starlette.middleware.cors import CORSMiddleware

from serve.api.errors import APIError

log = logging.getLogger("strata.http")

DEFAULT_PORTS = {"http": "80", "https": "443"}


def origin_key(origin: str) -> str:
    """'HTTP://Example.com:80/' -> 'http://example.com' (scheme and host lower case, default port dropped)."""
    origin = origin.strip().rstrip("/").lower()
    scheme, _, rest = origin.partition("://")
    if rest and rest.rsplit(":", 1)[-1] == DEFAULT_PORTS.get(scheme) and not rest.endswith("]"):
        rest = rest.rsplit(":", 1)[0]
    return f"{scheme}://{rest}" if rest else origin


def same_origin(origin: str, scheme: str, host_header: str) -> bool:
    return bool(host_header) and origin_key(origin) == origin_key(f"{scheme}://{host_header}")


class OriginCheck:
    """ASGI middleware: the origin rule above, for HTTP requests."""

    def __init__(self, app, origins: tuple[str, ...]):
        self.app = app
        self.any = "*" in origins
        self.origins = frozenset(origin_key(o) for o in origins if o != "*")
        self.cors = CORSMiddleware(app, allow_origins=["*"] if self.any else sorted(self.origins),
                                   allow_methods=["*"], allow_headers=["*"], max_age=600) if origins else None

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers", ()))
        origin = headers.get(b"origin", b"").decode("latin-1")
        if not origin or same_origin(origin, scope.get("scheme", "http"), headers.get(b"host", b"").decode("latin-1")):
            return await self.app(scope, receive, send)
        if self.cors is not None and (self.any or origin_key(origin) in self.origins):
            return await self.cors(scope, receive, send)
        path = scope.get("path", "")
        log.warning("refused a cross-origin %s %s from %r", scope.get("method"), path, origin)
        error = APIError(403, f"cross-origin request from {origin!r} refused; start the server with "
                              f"--cors-origin {origin} to allow that page", code="origin_not_allowed")
        await error.response(path)(scope, receive, send)
