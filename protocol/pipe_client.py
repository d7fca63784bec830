"""A synchronous client for an engine process over its pipes (tests and tools drive engines with it)."""
from __future__ import annotations

import subprocess
import threading

from protocol import messages as m
from protocol.codec import decode, encode


class EnginePipe:
    def __init__(self, cmd: list[str], cwd=None, env=None):
        self.proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, bufsize=1)
        self.lines: list[str] = []
        self.stderr: list[str] = []
        threading.Thread(target=self._drain_stderr, daemon=True).start()

    def _drain_stderr(self) -> None:
        for line in self.proc.stderr:
            self.stderr.append(line)

    def send(self, *msgs: m.Message | str) -> None:
        """Lines to the engine, in one write: several arrive together (a GEN or RESUME and the YIELD offered
        with it are in the engine's inbox before it reads a row)."""
        self.proc.stdin.write("".join((msg if isinstance(msg, str) else encode(msg)) + "\n" for msg in msgs))
        self.proc.stdin.flush()

    def read(self) -> m.Message:
        line = self.proc.stdout.readline()
        if not line:
            try:
                self.proc.wait(10)  # its last words reach stderr before it is gone
            except subprocess.TimeoutExpired:
                pass
            raise EOFError(f"engine closed stdout (exit {self.proc.poll()}):\n{''.join(self.stderr[-60:])}")
        self.lines.append(line.rstrip("\n"))
        return decode(line)

    def handshake(self) -> m.Ready:
        """Read up to READY; the INFO fields are kept in self.info."""
        self.info: dict[str, str] = {}
        while True:
            msg = self.read()
            if isinstance(msg, m.Info):
                self.info.update(msg.fields)
            if isinstance(msg, m.Ready):
                return msg

    def read_until(self, *types, ident: int | None = None) -> list[m.Message]:
        """Read lines up to and including the first of `types` (for `ident` if given). Where what is
        awaited would never come, the wait ends at once with the line that says so: an ERR for `ident`
        (the request is over), its DONE (it ended first), or, awaiting its SUSPENDED, its DECLINE (the
        park was refused)."""
        got = []
        while True:
            msg = self.read()
            got.append(msg)
            if isinstance(msg, types) and (ident is None or msg.id == ident):
                return got
            if ident is None or msg.id != ident:
                continue
            if isinstance(msg, m.Err) and m.Err not in types:
                raise RuntimeError(f"the engine refused request {ident}: {msg.message}")
            if isinstance(msg, m.Done) and m.Done not in types:
                raise RuntimeError(f"request {ident} ended ({msg.finish}) before a {types[0].__name__} came")
            if isinstance(msg, m.Decline) and m.Suspended in types and m.Decline not in types:
                raise RuntimeError(f"request {ident}'s park was declined ({msg.reason} at {msg.done})")

    def close(self, timeout_s: float = 20) -> int:
        if self.proc.poll() is None:
            try:
                self.send("QUIT")
                self.proc.stdin.close()
            except (BrokenPipeError, ValueError):
                pass
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode
