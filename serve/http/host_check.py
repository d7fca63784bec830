"""Host header check against DNS rebinding (the attack behind Ollama's CVE-2024-28224).

A page whose DNS name is rebound to 127.0.0.1 reaches a loopback server same-origin in the
browser's eyes, but its requests still carry the page's own Host name. So a server bound to a
loopback address answers only loopback Host names and the names the user added with
--allowed-hosts (a reverse proxy's). Bound to another address, the user chose exposure: the check
applies only when --allowed-hosts is given (Ollama's rule after its fix). Loopback names are
always answered: a rebinding page's requests carry the page's name, never 'localhost'.
"""
from __future__ import annotations

import ipaddress
import logging

from serve.api.errors import APIError

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")

log = logging.getLogger("strata.http")


def is_loopback(host: str) -> bool:
    name = host.strip("[]").lower()
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def host_name(header: str) -> str:
    """'example.com:8080' -> 'example.com'; '[::1]:8080' -> '::1'; lower case, no trailing dot."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1:header.find("]")] if "]" in header else header[1:]
    if header.count(":") == 1:
        header = header.split(":", 1)[0]
    return header.rstrip(".")


def allowed_host_names(bind_host: str, extra: tuple[str, ...] | None) -> frozenset[str] | None:
    """The Host names to accept, or None when every Host is accepted (bound beyond loopback, no list).
    Loopback names are always among them: only a client that addressed the loopback sends one."""
    if extra is None and not is_loopback(bind_host):
        return None
    return frozenset(LOOPBACK_NAMES) | {host_name(h) for h in extra or ()}


class HostCheck:
    """ASGI middleware: a request whose Host is not allowed gets 403 on every path, before routing."""

    def __init__(self, app, allowed: frozenset[str] | None):
        self.app, self.allowed = app, allowed

    async def __call__(self, scope, receive, send):
        if self.allowed is None or scope["type"] not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        header = next((v.decode("latin-1") for k, v in scope.get("headers", ()) if k == b"host"), "")
        name = host_name(header)
        # no Host at all (HTTP/1.0 by hand) cannot come from a browser, so it is not a rebinding
        if not header or name in self.allowed or (name.endswith(".localhost") and "localhost" in self.allowed):
            return await self.app(scope, receive, send)
        path = scope.get("path", "")
        log.warning("refused Host %r on %s", header, path)
        if scope["type"] != "http":
            return await send({"type": "websocket.close", "code": 1008})
        error = APIError(403, f"Host {header!r} is not allowed: this server answers "
                              f"{', '.join(sorted(self.allowed))}; add a name with --allowed-hosts",
                         code="host_not_allowed")
        await error.response(path)(scope, receive, send)
