"""The benches' streaming client: one POST whose answer is server-sent events, read chunk by chunk
(OpenAI's `data: {...}` lines; `data: [DONE]` and keep-alive comments are skipped).

Every request of a process goes through one shared client, as an application's does (the openai SDK
keeps one httpx.Client). A client made per request, as `httpx.stream` does, builds an SSL context with
its certificate store each time: 20-150 ms of CPU under the GIL, so 16 or 64 threads starting at once
were released one after another, and that wait was counted in their time to first token (on the H200
machine, ~0.34 s before the first of 16 sub-agents' requests reached the server). Its connections are
not kept alive: llama-server's HTTP threads each hold a kept-alive connection until it times out (5 s),
so idle pooled connections made later requests wait for a thread (its agent's first turn 6.2 s)."""
from __future__ import annotations

import json
import threading
from collections.abc import Iterator

import httpx

_client: httpx.Client | None = None
_made = threading.Lock()


def shared_client() -> httpx.Client:
    """The process's client, made at the first call: plain HTTP to local servers, no certificate store,
    room for as many connections as the benches' clients (256 at most), each closed after its request."""
    global _client
    with _made:
        if _client is None:
            _client = httpx.Client(verify=False, limits=httpx.Limits(max_connections=1024,
                                                                     max_keepalive_connections=0))
        return _client


class StreamRefused(Exception):
    """The server answered with a status other than 200 (the message: the status and the body's start)."""


def stream_chunks(url: str, path: str, body: dict, timeout: float) -> Iterator[dict]:
    """POST `body` to url + path with streaming on; yields each event's JSON as it arrives. Raises
    StreamRefused for a non-200 answer, httpx.HTTPError for a transport failure and ValueError for a
    line that is not JSON."""
    with shared_client().stream("POST", f"{url}{path}", json=body, timeout=timeout) as r:
        if r.status_code != 200:
            raise StreamRefused(f"HTTP {r.status_code}: {r.read()[:300]!r}")
        for line in r.iter_lines():
            if line.startswith("data: {"):
                yield json.loads(line[6:])
