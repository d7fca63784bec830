"""Debian's Firefox ESR, headless, driven over WebDriver BiDi, the W3C protocol Firefox speaks itself
(no geckodriver: Debian does not package it, and this machine reaches no other download). A
minimal client: a session, one tab, navigation, script evaluation, keyboard input, the viewport,
and the console's errors."""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time

import websocket

FIREFOX = shutil.which("firefox-esr") or shutil.which("firefox") or "/usr/bin/firefox-esr"
KEYS = {"\n": "\ue007", "ENTER": "\ue007", "ESCAPE": "\ue00c", "TAB": "\ue004"}


class Firefox:
    """Firefox in its own process group and its own empty profile, ended and removed by close()."""

    def __init__(self, width: int = 1280, height: int = 860, start_timeout_s: float = 60):
        self.profile = tempfile.mkdtemp(prefix="strata-firefox-")
        self.proc = subprocess.Popen([FIREFOX, "--headless", "--no-remote", "--profile", self.profile,
                                      "--remote-debugging-port", "0", "--width", str(width), "--height", str(height)],
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     start_new_session=True)
        self.errors: list[str] = []
        self.next_id = 0
        try:
            self.ws = websocket.create_connection(self._listening(start_timeout_s) + "/session", suppress_origin=True,
                                                  timeout=60)
            self.command("session.new", capabilities={})
            self.context = self.command("browsingContext.getTree")["contexts"][0]["context"]
            self.command("session.subscribe", events=["log.entryAdded"])
        except BaseException:
            self.close()
            raise

    def _listening(self, timeout_s: float) -> str:
        deadline, seen = time.monotonic() + timeout_s, []
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line and self.proc.poll() is not None:
                break
            seen.append(line)
            found = re.search(r"WebDriver BiDi listening on (ws://\S+)", line)
            if found:  # from here on its output is read and dropped, so that a full pipe never blocks it
                threading.Thread(target=self.proc.stdout.read, daemon=True).start()
                return found.group(1)
        raise RuntimeError("Firefox did not start its WebDriver BiDi server:\n" + "".join(seen))

    def command(self, method: str, **params) -> dict:
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            message = json.loads(self.ws.recv())
            if message.get("method") == "log.entryAdded" and message["params"].get("level") == "error":
                self.errors.append(message["params"].get("text", ""))
            if message.get("id") == self.next_id:
                if message.get("type") == "error":
                    raise RuntimeError(f"{method}: {message.get('error')}: {message.get('message')}")
                return message["result"]

    def get(self, url: str) -> None:
        self.command("browsingContext.navigate", context=self.context, url=url, wait="complete")

    def run(self, expression: str):
        """The value of a JavaScript expression in the page (JSON-like values only)."""
        result = self.command("script.evaluate", expression=expression, target={"context": self.context},
                              awaitPromise=True)
        if result["type"] == "exception":
            raise RuntimeError(result["exceptionDetails"]["text"])
        return from_remote(result["result"])

    def type(self, *texts: str) -> None:
        """Keys into the focused element: text, or a name of KEYS (ENTER, ESCAPE, TAB)."""
        actions = []
        for text in texts:
            for char in [KEYS[text]] if text in KEYS else text:
                actions += [{"type": "keyDown", "value": KEYS.get(char, char)}, {"type": "keyUp", "value": KEYS.get(char, char)}]
        self.command("input.performActions", context=self.context,
                     actions=[{"type": "key", "id": "keyboard", "actions": actions}])

    def viewport(self, width: int, height: int) -> None:
        self.command("browsingContext.setViewport", context=self.context, viewport={"width": width, "height": height})

    def console_errors(self) -> list[str]:
        self.run("0")  # a round trip: events sent before it are read
        errors, self.errors = self.errors, []
        return errors

    def close(self) -> None:
        try:
            if getattr(self, "ws", None) is not None:
                self.ws.close()
        finally:
            if self.proc.poll() is None:
                os.killpg(self.proc.pid, signal.SIGTERM)
                try:
                    self.proc.wait(10)
                except subprocess.TimeoutExpired:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                    self.proc.wait()
            shutil.rmtree(self.profile, ignore_errors=True)

    def __enter__(self) -> "Firefox":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def from_remote(value: dict):
    """WebDriver BiDi's serialized value as Python's."""
    kind, inner = value["type"], value.get("value")
    if kind in ("undefined", "null"):
        return None
    if kind == "array":
        return [from_remote(v) for v in inner]
    if kind == "object":
        return {k: from_remote(v) for k, v in inner}
    if kind == "number" and isinstance(inner, str):  # NaN, Infinity, -0
        return float(inner)
    return inner
