"""Stored Responses API turns (`previous_response_id`): in memory, the most recent STORE_SIZE."""
from __future__ import annotations

from collections import OrderedDict

from serve.api.errors import APIError

STORE_SIZE = 1000


class ResponseStore:
    """Stored responses' conversations (the chat messages up to and including the answer), by id."""

    def __init__(self, size: int = STORE_SIZE):
        self.size, self.items = size, OrderedDict()

    def get(self, rid: str) -> list[dict]:
        if rid not in self.items:
            raise APIError(404, f"no stored response with id {rid!r} (responses are kept in memory; the server "
                                "may have restarted, or the response was made with store: false)",
                           param="previous_response_id")
        return self.items[rid]

    def put(self, rid: str, messages: list[dict]) -> None:
        self.items[rid] = messages
        while len(self.items) > self.size:
            self.items.popitem(last=False)
