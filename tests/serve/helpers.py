"""Small HTTP helpers for server tests."""
from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from engine.modelfile.tokenizer import load_tokenizer
from tests.harness import ROOT, mock_engine_cmd


def chat(url: str, content: str = "Hello", **body) -> httpx.Response:
    return httpx.post(f"{url}/v1/chat/completions", json={"messages": [{"role": "user", "content": content}], **body},
                      timeout=60)


def complete_tokens(url: str, n_prompt: int, max_tokens: int = 4, **body) -> httpx.Response:
    return httpx.post(f"{url}/v1/completions", json={"prompt": list(range(100, 100 + n_prompt)),
                                                      "max_tokens": max_tokens, **body}, timeout=120)


def sse_chunks(url: str, path: str, body: dict, timeout: float = 120):
    """The JSON chunks of a streamed response, as they arrive (keep-alives and [DONE] skipped);
    an error event fails the test."""
    with httpx.stream("POST", url + path, json=body | {"stream": True}, timeout=timeout) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                chunk = json.loads(line[6:])
                assert "error" not in chunk, chunk
                yield chunk


def metrics(url: str) -> dict[str, float]:
    """Every sample as 'name{labels}' -> value, parsed by prometheus_client's own parser."""
    out = {}
    for family in text_string_to_metric_families(httpx.get(f"{url}/metrics").text):
        for s in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
            out[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return out


def post_and_leave(url: str, prompt: str = "leaving", after_s: float = 0.2) -> None:
    """A client that sends a completion and disconnects after `after_s` without waiting for it."""
    try:
        httpx.post(f"{url}/v1/completions", json={"prompt": prompt, "max_tokens": 5}, timeout=after_s)
    except httpx.TimeoutException:
        pass


class Background(threading.Thread):
    """Run a request on a thread; .result holds the response or the exception."""

    def __init__(self, fn, *args, **kwargs):
        super().__init__(daemon=True)
        self.fn, self.args, self.kwargs, self.result = fn, args, kwargs, None

    def run(self):
        try:
            self.result = self.fn(*self.args, **self.kwargs)
        except Exception as e:  # recorded for the test to assert on
            self.result = e

    def get(self, timeout: float = 120):
        self.join(timeout)
        assert not self.is_alive(), "background request did not finish"
        return self.result


def make_thinking_model(folder: Path) -> Path:
    """A tiny model file whose chat template is Qwen3's, a thinking model's (the server reads its
    tokenizer and template; a mock engine answers)."""
    path = folder / "qwen3-tiny.gguf"
    subprocess.run([sys.executable, str(ROOT / "tools/fixtures/make_synthetic_gguf.py"), str(path), "--arch", "qwen3",
                    "--layers", "1", "--dim", "64", "--ffn", "64", "--heads", "1", "--kv-heads", "1", "--ctx", "512",
                    "--type", "F32", "--chat-template", str(ROOT / "tests/fixtures/templates/Qwen-Qwen3-0.6B.jinja")],
                   check=True, capture_output=True)
    return path


def scripted_engine_cmd(model: Path, output: str, *args: str) -> str:
    """The mock engine answering every request with `output` (in the model's tokens), then EOS."""
    tok = load_tokenizer(str(model))
    script = ",".join(map(str, tok.encode(output, add_bos=False) + [tok.special.eos]))
    return mock_engine_cmd("--script", script, "--eos", str(tok.special.eos), *args)


def state_events(url: str, seconds: float, hz: float = 4, model: str | None = None,
                 **kwargs) -> list[tuple[float, dict]]:
    """(arrival time, message) of every state event of GET /v1/events within `seconds` (one at least)."""
    out, started = [], time.monotonic()
    params = {"hz": hz} | ({"model": model} if model is not None else {})
    with httpx.stream("GET", f"{url}/v1/events", params=params, timeout=30, **kwargs) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream"), r.read()
        event = None
        for line in r.iter_lines():
            if line.startswith("event:"):
                event = line[6:].strip()
            elif line.startswith("data:"):
                assert event == "state"
                out.append((time.monotonic() - started, json.loads(line[5:])))
            if out and time.monotonic() - started > seconds:
                break
    return out
