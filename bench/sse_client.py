"""The benches' streaming client: one POST whose answer is server-sent events, read chunk by chunk
(OpenAI's `data: {...}` lines; `data: [DONE]` and keep-alive comments are skipped)."""
from __future__ import annotations

import json
from collections.abc import Iterator

import httpx


class StreamRefused(Exception):
    """The server answered with a status other than 200 (the message: the status and the body's start)."""


def stream_chunks(url: str, path: str, body: dict, timeout: float) -> Iterator[dict]:
    """POST `body` to url + path with streaming on; yields each event's JSON as it arrives. Raises
    StreamRefused for a non-200 answer, httpx.HTTPError for a transport failure and ValueError for a
    line that is not JSON."""
    with httpx.stream("POST", f"{url}{path}", json=body, timeout=timeout) as r:
        if r.status_code != 200:
            raise StreamRefused(f"HTTP {r.status_code}: {r.read()[:300]!r}")
        for line in r.iter_lines():
            if line.startswith("data: {"):
                yield json.loads(line[6:])
