"""Server-sent events: one JSON object per `data:` line, whatever the text inside it.

json.dumps(ensure_ascii=False) leaves U+0085, U+2028 and U+2029 raw inside strings, and line
splitters built on str.splitlines (httpx's iter_lines, for one) break an event's line there, so a
client gets half a JSON object. Escaped, they are still the same string to any JSON parser.
"""
from __future__ import annotations

import json

LINE_BREAKS = {"\x85": "\\u0085", "\u2028": "\\u2028", "\u2029": "\\u2029"}


def one_line_json(data: dict) -> str:
    text = json.dumps(data, ensure_ascii=False)
    for raw, escaped in LINE_BREAKS.items():
        text = text.replace(raw, escaped)
    return text


def data_event(data: dict | str) -> str:
    """An OpenAI stream's event (a dict, or a literal such as [DONE])."""
    return f"data: {data if isinstance(data, str) else one_line_json(data)}\n\n"


def named_event(name: str, data: dict) -> str:
    """An Anthropic stream's event: its type on an `event:` line, then its data."""
    return f"event: {name}\ndata: {one_line_json(data)}\n\n"
