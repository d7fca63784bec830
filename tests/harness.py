"""Process-level harness: the real strata-server, the real engine and the mock engine as subprocesses."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from protocol.pipe_client import EnginePipe

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def mock_engine_cmd(*args: str) -> str:
    return " ".join([PY, "-m", "protocol.mock_engine", *args])


@dataclass
class ServerProcess:
    """strata-server with typed defaults turned into flags; start() polls /health, fails fast."""

    engine_cmd: str | None = None  # None: the real engine on the default model
    api_key: str | None = None
    keepalive_s: float = 0.5
    extra: list[str] = field(default_factory=list)
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen | None = None
    log_path: Path | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 120.0, wait_ready: bool = True) -> "ServerProcess":
        cmd = [PY, "-m", "serve", "--port", str(self.port), "--keepalive-s", str(self.keepalive_s),
               "--log-level", "warning", *self.extra]
        if self.engine_cmd:
            cmd += ["--engine-cmd", self.engine_cmd]
        if self.api_key:
            cmd += ["--api-key", self.api_key]
        self.log_path = Path(os.environ.get("TMPDIR", "/tmp")) / f"strata-server-{self.port}.log"
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=open(self.log_path, "wb"), stderr=subprocess.STDOUT,
                                     start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"strata-server exited with {self.proc.returncode}:\n{self.log()}")
            try:
                r = httpx.get(self.url + "/health", timeout=1)
                if r.status_code == 200 or (not wait_ready and r.status_code == 503):
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        self.stop()
        raise TimeoutError(f"strata-server not ready in {timeout_s}s:\n{self.log()}")

    def wait_healthy(self, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                return
            time.sleep(0.1)
        raise TimeoutError("server did not become healthy")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path and self.log_path.exists() else ""

    def engine_pids(self) -> list[int]:
        out = subprocess.run(["pgrep", "-P", str(self.proc.pid)], capture_output=True, text=True).stdout
        return [int(p) for p in out.split()]

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


class EngineProcess(EnginePipe):
    """An engine (real or mock) driven directly over its pipes, from the repository root."""

    def __init__(self, cmd: list[str]):
        super().__init__(cmd, cwd=ROOT)
