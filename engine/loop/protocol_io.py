"""The loop's protocol I/O: stdin lines decoded into an inbox by a thread of their own, messages
written out as lines, and notes to stderr (once per kind)."""
from __future__ import annotations

import queue
import sys
import threading
from typing import Callable, TextIO

from protocol import messages as m
from protocol.codec import ProtocolError, decode, encode

_EOF = object()


class Writer:
    """Serialized line output (the stdin thread writes ERR lines too)."""

    def __init__(self, out: TextIO):
        self.out, self.lock = out, threading.Lock()

    def __call__(self, msg: m.Message) -> None:
        self.raw(encode(msg))

    def raw(self, line: str) -> None:
        with self.lock:
            self.out.write(line + "\n")
            self.out.flush()


class Inbox:
    """The decoded lines waiting for the loop; `gone` once input has ended (nobody listens any more)."""

    def __init__(self):
        self.queue: queue.Queue = queue.Queue()
        self.gone = False

    def put(self, msg: m.Message) -> None:
        self.queue.put(msg)

    def empty(self) -> bool:
        return self.queue.empty()

    def read(self, stdin: TextIO, write: Callable[[m.Message], None]) -> None:
        """The stdin thread: every line decoded into the inbox (a malformed one answered ERR)."""
        for line in iter(stdin.readline, ""):
            if not line.strip():
                continue
            try:
                self.queue.put(decode(line))
            except ProtocolError as e:
                write(m.Err(str(e), e.id))
        self.queue.put(_EOF)

    def start_reading(self, stdin: TextIO, write: Callable[[m.Message], None]) -> None:
        threading.Thread(target=self.read, args=(stdin, write), daemon=True).start()

    def take(self, handle: Callable[[m.Message], None], block: bool, timeout_s: float | None = None) -> None:
        """Hand the lines that arrived to `handle`; with block, wait for one first (the engine is idle), for
        timeout_s at most where given."""
        while not self.gone:
            try:
                msg = self.queue.get(block=block, timeout=timeout_s if block else None)
            except queue.Empty:
                return
            block = False
            if msg is _EOF:
                self.gone = True
            else:
                handle(msg)


class LogOnce:
    """A note to stderr the first time something of its kind happens (not on every park or pause)."""

    def __init__(self):
        self.logged: set[str] = set()

    def __call__(self, kind: str, text: str) -> None:
        if kind not in self.logged:
            self.logged.add(kind)
            print(f"strata: {text}", file=sys.stderr, flush=True)
