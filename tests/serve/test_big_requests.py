"""Big requests are refused without stalling the server (issue 42): a body over --max-body-mb gets 413
before it is read whole, a prompt that cannot fit the context is refused before it is tokenized, and
prompts are rendered and tokenized off the event loop. Meanwhile /health and a stream on another
connection keep answering, and the server's memory stays flat. The real server, engine and default
model on the CPU, with its default context (8192 tokens: the 4 MiB floor of the body limit)."""
from __future__ import annotations

import json
import re
import socket
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from tests.harness import ServerProcess
from tests.serve.helpers import chat

MIB = 1 << 20
DEFAULT_LIMIT = 4 * MIB  # the default model's context (8192) x 16 bytes is under the 4 MiB floor
TARGET_S = 0.1  # the issue's: /health and a stream on another connection answer within 100 ms meanwhile
# The stream's events: its tokens, and between them an SSE comment every KEEPALIVE_S, paced by the
# server's event loop; so a gap over TARGET_S is the server's, not the engine's (on a busy 2-core
# machine the small model writes a token every 0.1-0.6 s).
KEEPALIVE_S = 0.03
CHAT = "/v1/chat/completions"
WORDS = b"The quick brown fox jumps over the lazy dog. "


@pytest.fixture(scope="module")
def server():
    with ServerProcess(keepalive_s=KEEPALIVE_S, extra=["--device", "cpu"]) as s:
        yield s


def chat_body(size: int, piece: int = MIB):
    """A chat request's JSON of exactly `size` bytes, one user message of 'a's, made piece by piece as
    it is sent (the test holds a piece, never the body)."""
    head, tail = b'{"messages": [{"role": "user", "content": "', b'"}], "max_tokens": 1}'
    filler = size - len(head) - len(tail)
    chunk = b"a" * piece
    yield head
    for _ in range(filler // piece):
        yield chunk
    yield chunk[:filler % piece] + tail


def post_body(url: str, size: int, declared: bool) -> httpx.Response:
    """POST a generated chat body of `size` bytes, streamed chunked or with its Content-Length."""
    headers = {"content-type": "application/json"} | ({"content-length": str(size)} if declared else {})
    return httpx.post(url + CHAT, content=chat_body(size), headers=headers, timeout=300)


def assert_too_large(r: httpx.Response) -> None:
    assert r.status_code == 413, r.text
    err = r.json()["error"]
    assert err["code"] == "request_too_large" and "--max-body-mb 4" in err["message"], err


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmRSS for process {pid}")


class Probe(threading.Thread):
    """Repeats `step` on its own thread until stopped, keeping what each returns."""

    def __init__(self, step, every_s: float):
        super().__init__(daemon=True)
        self.step, self.every_s, self.stopping, self.samples, self.error = step, every_s, threading.Event(), [], None

    def run(self):
        try:
            while not self.stopping.is_set():
                self.samples.append(self.step())
                self.stopping.wait(self.every_s)
        except Exception as e:  # the test asserts on it
            self.error = e

    def stop(self) -> list:
        self.stopping.set()
        self.join(60)
        assert not self.is_alive() and self.error is None, self.error
        return self.samples


class ChatStream(threading.Thread):
    """A streamed chat request on its own connection, read until stopped: when each of its events
    (tokens, keep-alive comments) arrived, and which were tokens. Counting keeps the model writing."""

    BODY = {"messages": [{"role": "user", "content": "Count from 1 to 1000, one number a line."}],
            "temperature": 0, "max_tokens": 4000, "stream": True}

    def __init__(self, url: str):
        super().__init__(daemon=True)
        self.url, self.stopping, self.error = url, threading.Event(), None
        self.events: list[float] = []  # (after the first token) every line of the stream
        self.tokens: list[float] = []
        self.writing = threading.Event()  # the first token came

    def run(self):
        try:
            with httpx.stream("POST", self.url + CHAT, json=self.BODY, timeout=60) as r:
                assert r.status_code == 200, r.read()
                for line in r.iter_lines():
                    self.note(line, time.perf_counter())
                    if self.stopping.is_set() or line == "data: [DONE]":
                        return
        except Exception as e:  # the test asserts on it
            self.error = e

    def note(self, line: str, at: float) -> None:
        if line.startswith("data: {"):
            chunk = json.loads(line[6:])
            assert "error" not in chunk, chunk
            if chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                self.tokens.append(at)
                self.writing.set()
        if line and self.writing.is_set():
            self.events.append(at)

    def stop(self) -> None:
        self.stopping.set()
        self.join(60)
        assert not self.is_alive() and self.error is None, self.error


@contextmanager
def watched(server: ServerProcess):
    """Around a block: a writing chat stream and /health polled, each on its own connection, and the
    server's resident memory sampled. Yields a dict filled on exit: the health latencies, the stream's
    gaps and tokens within the block, the memory before and at most."""
    stream, seen = ChatStream(server.url), {"rss_before": rss_kib(server.proc.pid)}
    stream.start()
    assert stream.writing.wait(120), "the chat stream wrote nothing"
    with httpx.Client(timeout=30) as client:
        def health() -> float:
            started = time.perf_counter()
            assert client.get(server.url + "/health").status_code == 200
            return time.perf_counter() - started

        probes = Probe(health, 0.02), Probe(lambda: rss_kib(server.proc.pid), 0.02), Probe(own_lag, 0)
        for probe in probes:
            probe.start()
        start = time.perf_counter()
        try:
            yield seen
        finally:
            end = time.perf_counter()
            seen["health"], rss, seen["own_lag"] = (probe.stop() for probe in probes)
            stream.stop()
    seen["rss_max"] = max(rss)
    seen["gaps"] = [b - a for a, b in zip(stream.events, stream.events[1:]) if start <= b <= end]
    seen["tokens"] = [t for t in stream.tokens if start <= t <= end]
    seen["tokens_after"] = [t for t in stream.tokens if t > end]
    print(f"\n  health: {len(seen['health'])} polls, max {max(seen['health']) * 1000:.1f} ms; stream: "
          f"{len(seen['gaps'])} gaps, max {max(seen['gaps']) * 1000:.1f} ms, {len(seen['tokens'])} token events; "
          f"server RSS {seen['rss_before']} KiB before, {seen['rss_max']} KiB at most; this process's own "
          f"scheduling lag at most {max(seen['own_lag']) * 1000:.1f} ms")


def own_lag() -> float:
    """How late a 10 ms sleep of this process wakes: when the machine is short of CPU (a busy 2-core
    CI box), this process's threads are late, and so are the server's, through no fault of its own."""
    started = time.perf_counter()
    time.sleep(0.01)
    return time.perf_counter() - started - 0.01


def assert_answered_meanwhile(seen: dict, allowed_s: float = TARGET_S) -> None:
    """/health answered and the stream's events came within allowed_s, plus the machine's own delay
    meanwhile (own_lag: at most a few ms when it has CPU to spare)."""
    bound = allowed_s + max(seen["own_lag"])
    assert max(seen["health"]) <= bound, (sorted(seen["health"])[-5:], bound)
    assert seen["gaps"] and max(seen["gaps"]) <= bound, (sorted(seen["gaps"])[-5:], bound)
    assert seen["tokens"] or seen["tokens_after"], "the stream stopped writing"


def test_big_bodies_get_413_while_the_server_keeps_answering_and_its_memory_stays_flat(server):
    assert chat(server.url, "Hi", max_tokens=2).status_code == 200  # warm: lazy imports and first buffers done
    with watched(server) as seen:
        for size in (20 * 1000 * 1000, 200 * 1000 * 1000):
            for declared in (True, False):
                started = time.perf_counter()
                assert_too_large(post_body(server.url, size, declared))
                print(f"  {size // 1000 // 1000} MB {'with Content-Length' if declared else 'chunked'}: 413 in "
                      f"{time.perf_counter() - started:.2f} s (the upload's time included)")
    assert_answered_meanwhile(seen)
    assert seen["rss_max"] <= 1.5 * seen["rss_before"], seen
    log = server.log()
    assert "Content-Length 200000000:" in log and "Content-Length 20000000:" in log  # refused on the header
    assert chat(server.url, "Hi", max_tokens=2).status_code == 200


def test_prompts_are_tokenized_off_the_event_loop(server, tokenizer):
    """A chat prompt just short of what the context could hold at the longest tokens is tokenized (then
    refused: it is 130K tokens), and count_tokens counts 3 MB: seconds of tokenizing, in a thread. Twice
    the target: turning 670K token ids into a Python list and freeing the tokenizer's work hold the GIL
    (about 50 ms for 3 MB on an idle core), which the loop waits out; on the loop the whole would stall it
    for as long as the tokenizing takes. On a busy machine (the suite's other workers on both cores) those
    GIL holds stretch with the server's share of a core (0.42 s seen once): the bound is then a quarter of
    the tokenizing's own time, which a loop doing the work itself could not keep (its stall would be at
    least half of it, the longer request's)."""
    text = (WORDS * (600_000 // len(WORDS))).decode()
    count = (WORDS * (3_000_000 // len(WORDS))).decode()
    text_tokens, count_tokens = len(tokenizer.encode(text)), len(tokenizer.encode(count))
    with watched(server) as seen:
        started = time.perf_counter()
        r = chat(server.url, text, max_tokens=1)
        told = re.match(r"prompt is too long: (\d+) tokens > 8191 maximum", r.json()["error"]["message"])
        assert r.status_code == 400 and told and int(told[1]) > text_tokens, r.text  # counted: the template's too
        r = httpx.post(server.url + "/v1/messages/count_tokens", timeout=120,
                       json={"model": "m", "messages": [{"role": "user", "content": count}]})
        assert r.status_code == 200 and r.json()["input_tokens"] > count_tokens, r.text
        tokenizing_s = time.perf_counter() - started
    print(f"  the two requests took {tokenizing_s:.2f} s")
    assert_answered_meanwhile(seen, max(2 * TARGET_S, tokenizing_s / 4))
    assert chat(server.url, "Hi", max_tokens=2).status_code == 200


REQUESTS = {  # path: a request's JSON around a prompt's text
    CHAT: lambda text: {"messages": [{"role": "user", "content": text}], "max_tokens": 1},
    "/v1/completions": lambda text: {"prompt": text, "max_tokens": 1},
    "/v1/messages": lambda text: {"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": text}]},
    "/v1/responses": lambda text: {"input": text, "max_output_tokens": 1},
}


@pytest.mark.parametrize("path", REQUESTS)
def test_a_body_under_the_limit_with_a_prompt_too_long_is_refused_before_tokenizing(server, tokenizer, path):
    """4 MiB less a little of text: more bytes than 8192 tokens of the vocabulary's longest (81 bytes)
    can hold, so it is refused on its size, faster than tokenizing half of it takes (the request's own round
    trip, 4 MiB of JSON each way through the server, takes about what tokenizing a tenth does on this machine:
    a tenth made the bound a coin toss under load)."""
    text = (WORDS * ((DEFAULT_LIMIT - 4096) // len(WORDS))).decode()
    started = time.perf_counter()  # the tokenizer itself: its segments remembered would make this a lookup
    tokenizer.tk.encode_batch_fast([text[:len(text) // 10]], add_special_tokens=False)
    tenth_s = time.perf_counter() - started
    started = time.perf_counter()
    r = httpx.post(server.url + path, json=REQUESTS[path](text), timeout=120)
    took = time.perf_counter() - started
    print(f"\n  {path}: refused in {took:.2f} s; tokenizing a tenth of it takes {tenth_s:.2f} s")
    assert len(r.request.content) < DEFAULT_LIMIT and r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["message"].startswith("prompt is too long: at least ") and "> 8191 maximum" in error["message"]
    assert error.get("code", "context_length_exceeded") == "context_length_exceeded"
    assert error["type"] == "invalid_request_error"
    assert took < 5 * tenth_s, (took, tenth_s)
    assert chat(server.url, "Hi", max_tokens=2).status_code == 200


def raw_exchange(url: str, head: str, body_parts=()) -> bytes:
    """Sends a request's head and body parts on a socket (the body need not be complete) and returns
    the response as far as the server sends it before closing or 30 s of quiet."""
    where = urlsplit(url)
    with socket.create_connection((where.hostname, where.port), timeout=30) as s:
        s.sendall(head.encode())
        for part in body_parts:
            s.sendall(part)
        answer = b""
        while b"\r\n\r\n" not in answer or not answer.rstrip().endswith(b"}"):
            data = s.recv(65536)
            if not data:
                break
            answer += data
        return answer


def test_a_declared_length_over_the_limit_is_refused_before_any_of_the_body_is_sent(server):
    """Not even a 100 Continue: a client that asks for one need not send the body at all."""
    head = (f"POST {CHAT} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {200 * 1000 * 1000}\r\nExpect: 100-continue\r\n\r\n")
    answer = raw_exchange(server.url, head)
    assert answer.startswith(b"HTTP/1.1 413 "), answer[:200]
    assert b'"request_too_large"' in answer and b"--max-body-mb" in answer


def test_a_chunked_body_is_refused_once_it_passes_the_limit_without_waiting_for_its_end(server):
    head = (f"POST {CHAT} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            "Transfer-Encoding: chunked\r\n\r\n")
    piece = 64 * 1024
    chunks = [b"%x\r\n" % piece + b"a" * piece + b"\r\n"] * (DEFAULT_LIMIT // piece + 2)  # the limit and a bit, no end
    answer = raw_exchange(server.url, head, chunks)
    assert answer.startswith(b"HTTP/1.1 413 "), answer[:200]
    assert b'"request_too_large"' in answer
    assert chat(server.url, "Hi", max_tokens=2).status_code == 200
