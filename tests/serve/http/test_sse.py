"""Stream events stay one line for every line splitter (serve/http/sse.py): text holding U+0085, U+2028 or
U+2029 (a model can emit them) is escaped in the JSON, and parses back to the same text."""
import json

from serve.http.sse import data_event, named_event

TEXT = "one\x85two\u2028three\u2029four \u00e9\u4e2d"


def test_line_breaks_python_splits_on_are_escaped_and_the_text_comes_back_whole():
    for event in (data_event({"content": TEXT}), named_event("content_block_delta", {"text": TEXT})):
        lines = event.splitlines()  # what httpx's iter_lines does to a stream
        data = [line for line in lines if line.startswith("data: ")]
        assert len(data) == 1 and len([line for line in lines if line]) == (1 if event.startswith("data") else 2)
        assert TEXT in json.loads(data[0][len("data: "):]).values()
    assert "\u00e9\u4e2d" in data_event({"t": TEXT})  # other characters stay as they are (not \\u-escaped)
    assert data_event("[DONE]") == "data: [DONE]\n\n"
