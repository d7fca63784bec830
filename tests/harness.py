"""Process-level harness: the real strata-server, the real engine and the mock engine as subprocesses.

Every process a test run starts carries STRATA_TEST_RUN=<the run's id> in its environment (set once
in tests/conftest.py, inherited by servers' engines too), so that whatever a crashed or killed
fixture left behind can be found and ended: `sweep()` at the session's end and at exit. Under
pytest-xdist each worker is a session of its own: its id is the run's with "/<worker>" added, so
that a worker's sweep ends only its own processes, and the controller's (the whole run's id, a
prefix of every worker's) ends all of them. A server is started in its own process group and asks
the kernel for SIGTERM when the test process dies (engine/core/parent_death.py), which covers a
pytest killed outright.
"""
from __future__ import annotations

import atexit
import contextlib
import hashlib
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from engine.core.parent_death import die_with_parent  # noqa: F401 - the servers' preexec_fn, and tests'
from bench.server_health import FAILED, READY, server_health
from protocol.pipe_client import EnginePipe

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
# the CPU engines' expanded-weight cache (tests/conftest.py turns it on for the run) off, for a model started
# once or twice a run, whose expansion costs less than writing it: the Qwen fixture starts in 4.7 s, and in
# 30 s writing its 2.4 GB of float32 (engine/model/expanded_cache.py)
NO_WEIGHT_CACHE = {"STRATA_CPU_WEIGHT_CACHE": ""}
TEST_RUN_ENV = "STRATA_TEST_RUN"


def mark_test_run(worker: str | None = None) -> str:
    """Give this process (and so every process it starts) the run's id, the xdist worker's own
    under the run's when `worker` is given; returns it."""
    run = os.environ.setdefault(TEST_RUN_ENV, f"{os.getpid()}-{time.time_ns()}")
    if worker:
        os.environ[TEST_RUN_ENV] = run = f"{run}/{worker}"
    return run


def processes_of_this_run() -> list[int]:
    """Live processes (other than this one) whose environment carries this run's id, or the id of a
    worker under it."""
    run = os.environ.get(TEST_RUN_ENV)
    if not run:
        return []
    needles = [f"{TEST_RUN_ENV}={run}{end}".encode() for end in ("\0", "/")]
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:  # gone meanwhile, or not ours to read
            continue
        if any(needle in environ for needle in needles) and state != "Z":
            found.append(int(entry.name))
    return found


def alive(pid: int) -> bool:
    """Whether process `pid` exists and is not a zombie."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def sweep(grace_s: float = 5.0) -> list[str]:
    """End every process of this run still alive: SIGTERM, then SIGKILL after grace_s. Returns their
    command lines (empty when the tests ended all they started, as they should)."""
    pids = processes_of_this_run()
    described = []
    for pid in pids:
        try:
            described.append(f"{pid}: " + Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:200])
            os.kill(pid, signal.SIGTERM)
        except OSError:
            pass
    deadline = time.monotonic() + grace_s
    while pids and time.monotonic() < deadline:
        pids = [p for p in pids if p in processes_of_this_run()]
        time.sleep(0.1)
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    return described


atexit.register(sweep, 2.0)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def remake_fixture_models(folder: Path, fixture: dict, tool: str) -> dict[str, Path]:
    """The tiny GGUFs a transformers fixture was computed on, made again in `folder` with the
    fixture's arguments; each must be the very same bytes (else the fixture is stale: remake it
    with `tool`). Returns name -> path."""
    paths = {}
    for name, spec in fixture.items():
        path = folder / f"{name}.gguf"
        subprocess.run([PY, str(ROOT / "tools/fixtures/make_synthetic_gguf.py"), str(path), *spec["args"]], check=True,
                       capture_output=True)
        assert hashlib.sha256(path.read_bytes()).hexdigest() == spec["sha256"], (
            f"{name}: the synthetic GGUF differs from the fixture's; remake it ({tool})")
        paths[name] = path
    return paths


def mock_engine_cmd(*args: str) -> str:
    return " ".join([PY, "-m", "engine.mock_engine", *args])


@dataclass
class ServerProcess:
    """strata-server with typed defaults turned into flags; start() polls /health, fails fast."""

    engine_cmd: str | None = None  # None: the real engine on the default model
    api_key: str | None = None
    keepalive_s: float = 0.5
    extra: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)  # over this process's environment
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
        # in the run's folder (tests/conftest.py), which its end removes
        self.log_path = Path(os.environ.get("STRATA_TEST_RUN_DIR") or os.environ.get("TMPDIR", "/tmp")) / \
            f"strata-server-{self.port}.log"
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=os.environ | self.env,
                                         start_new_session=True, preexec_fn=die_with_parent)
        deadline = time.monotonic() + timeout_s
        while True:  # until it answers at all (503 while its engine starts)
            if self.proc.poll() is not None:
                raise RuntimeError(f"strata-server exited with {self.proc.returncode}:\n{self.log()}")
            if time.monotonic() >= deadline:
                self.stop()
                raise TimeoutError(f"strata-server not ready in {timeout_s}s:\n{self.log()}")
            try:
                httpx.get(self.url + "/health", timeout=1)
                break
            except httpx.TransportError:
                time.sleep(0.1)
        if wait_ready:
            try:
                self.wait_healthy(deadline - time.monotonic())
            except (RuntimeError, TimeoutError) as e:
                self.stop()
                raise type(e)(f"{e}:\n{self.log()}") from None
        return self

    def wait_healthy(self, timeout_s: float = 60.0) -> None:
        """Until /health says ready; at once an error where the server has ended or its engine could not start."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"strata-server exited with {self.proc.returncode}")
            health, said = server_health(self.url)
            if health == READY:
                return
            if health == FAILED:  # (waiting longer would not help)
                raise RuntimeError(f"the server's engine could not be started: {said}")
            time.sleep(0.1)
        raise TimeoutError("server did not become healthy")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path and self.log_path.exists() else ""

    def engine_pids(self) -> list[int]:
        out = subprocess.run(["pgrep", "-P", str(self.proc.pid)], capture_output=True, text=True).stdout
        return [int(p) for p in out.split()]

    def stop(self) -> None:
        """SIGINT (the server then QUITs its engine); whatever is left of the server's group or its
        engines 15 s later is killed. Safe to call twice."""
        if self.proc is None:
            return
        engines = self.engine_pids() if self.proc.poll() is None else []
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                pass
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)  # the server's own group: it, and anything it left
        self.proc.wait()
        deadline = time.monotonic() + 10
        for pid in engines:  # their own sessions; they end on QUIT or when their stdin closes
            while (alive := pid in processes_of_this_run()) and time.monotonic() < deadline:
                time.sleep(0.05)
            if alive:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)

    def __enter__(self):
        return self if self.proc is not None else self.start()

    def __exit__(self, *exc):
        self.stop()


class EngineProcess(EnginePipe):
    """An engine (real or mock) driven directly over its pipes, from the repository root."""

    def __init__(self, cmd: list[str], env: dict[str, str] | None = None):
        super().__init__(cmd, cwd=ROOT, env=os.environ | (env or {}))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
