"""The engine subprocess: start, handshake (INFO... READY), line demux, stop, restart on death."""
from __future__ import annotations

import asyncio
import logging
import subprocess
from dataclasses import dataclass, field
from enum import Enum
from typing import Callable

from protocol import messages as m
from protocol.codec import ProtocolError, decode, encode, verb
from serve.engine_proc.engine_launch import AdoptedProcess, abandon, launch

log = logging.getLogger("strata.engine")
LINE_LIMIT = 1 << 20


class EngineState(str, Enum):
    STARTING = "starting"
    READY = "ready"
    RESTARTING = "restarting"
    FAILED = "failed"  # restarts exhausted
    STOPPED = "stopped"


class HandshakeError(RuntimeError):
    pass


class StartRefused(HandshakeError):
    """The engine refused its model or options (an ERR before READY, exit status START_REFUSED): starting it
    again would not help."""


@dataclass
class EngineInfo:
    ctx: int = 0
    caps: tuple[str, ...] = ()
    fields: dict[str, str] = field(default_factory=dict)


class EngineClient:
    """Owns the subprocess. Parsed lines go to `on_message`, unparsable ones to `on_malformed`,
    and the end of the process to `on_exit` (after which the client restarts it; blame=False where the engine said
    why: it ran out of memory, and is started again taking fewer requests)."""

    def __init__(self, cmd: list[str], handshake_timeout_s: float, max_restarts: int,
                 on_message: Callable[[m.Message], None], on_malformed: Callable[[str, str], None],
                 on_exit: Callable[..., None], on_ready: Callable[[], None], on_failed: Callable[[], None],
                 env: dict[str, str] | None = None, launched: subprocess.Popen | None = None):
        """env: variables set for the engine beside the server's own (CUDA_VISIBLE_DEVICES).
        launched: the engine already started with this cmd and env (serve/engine_proc/engine_launch.py), taken
        for the first start instead of a new process."""
        self.cmd, self.handshake_timeout_s, self.max_restarts = cmd, handshake_timeout_s, max_restarts
        self.env, self.launched = env, launched
        self.on_message, self.on_malformed, self.on_exit = on_message, on_malformed, on_exit
        self.on_ready, self.on_failed = on_ready, on_failed
        self.state = EngineState.STARTING
        self.info = EngineInfo()
        self.proc: AdoptedProcess | None = None
        self.restarts = 0
        self.failure = ""
        self._reader: asyncio.Task | None = None
        self.stopping = False  # set once at shutdown: from then on an exit is expected, never restarted
        self.out_of_memory_at = 0  # requests in the engine when it said it ran out of memory (then exits)

    @property
    def ready(self) -> bool:
        return self.state is EngineState.READY

    # ------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Start with bounded retries; on success the reader task runs until the process ends."""
        for attempt in range(self.max_restarts + 1):
            if self.stopping:
                return
            try:
                await self._spawn_and_handshake()
                self.state = EngineState.READY
                self._reader = asyncio.create_task(self._read_lines(self.proc))
                self.on_ready()
                return
            except StartRefused as e:
                self.failure = str(e)
                log.error("engine refused to start: %s", e)
                await self._kill()
                break
            except (HandshakeError, OSError) as e:
                self.failure = str(e)
                log.error("engine start failed (attempt %d/%d): %s", attempt + 1, self.max_restarts + 1, e)
                await self._kill()
                await asyncio.sleep(min(0.5 * 2**attempt, 5.0))
        self.state = EngineState.FAILED
        log.error("engine could not be started; giving up: %s", self.failure)
        self.on_failed()

    async def _spawn_and_handshake(self) -> None:
        log.info("starting engine: %s%s", "".join(f"{k}={v} " for k, v in (self.env or {}).items()), " ".join(self.cmd))
        # one way to start an engine (serve/engine_proc/engine_launch.py): the first may have been started before
        # the server's own start-up; later ones (restarts) are started here
        launched, self.launched = self.launched or launch(self.cmd, self.env), None
        self.proc = await AdoptedProcess.adopt(launched, LINE_LIMIT)
        try:
            self.info = await asyncio.wait_for(self._handshake(self.proc), self.handshake_timeout_s)
        except asyncio.TimeoutError:
            raise HandshakeError(f"no READY within {self.handshake_timeout_s:.0f}s") from None
        log.info("engine ready: ctx=%d caps=%s %s", self.info.ctx, ",".join(self.info.caps), self.info.fields)

    async def _handshake(self, proc) -> EngineInfo:
        info, refusal = EngineInfo(), ""
        while True:
            raw = await proc.stdout.readline()
            if not raw:
                code = await proc.wait()
                if code == m.START_REFUSED:
                    raise StartRefused(refusal or "the engine refused its model or options (its log says why)")
                raise HandshakeError(f"engine exited during start-up (exit code {code})"
                                     + (f": {refusal}" if refusal else ""))
            line = raw.decode("utf-8", "replace")
            try:
                msg = decode(line)
            except ProtocolError as e:
                raise HandshakeError(f"malformed line during handshake: {e}") from None
            if isinstance(msg, m.Info):
                info.fields.update(msg.fields)
            elif isinstance(msg, m.Ready):
                info.ctx, info.caps = msg.ctx, msg.caps
                return info
            elif isinstance(msg, m.Err):
                refusal = msg.message  # why it will end (engine/startup.py load_or_exit)
            else:
                log.warning("ignoring %s before READY", verb(msg))

    async def _read_lines(self, proc) -> None:
        while True:
            raw = await proc.stdout.readline()
            if not raw:
                break
            line = raw.decode("utf-8", "replace")
            try:
                msg = decode(line)
            except ProtocolError as e:
                log.error("malformed engine line: %s", e)
                self.on_malformed(line.rstrip("\n"), str(e))
                continue
            if isinstance(msg, m.Info) and m.OUT_OF_MEMORY_RUNNING in msg.fields:
                self.out_of_memory_at = int(msg.fields[m.OUT_OF_MEMORY_RUNNING])
            self.on_message(msg)
        code = await proc.wait()
        if self.stopping:
            return
        self.state = EngineState.RESTARTING
        out_of_memory = code == m.OUT_OF_MEMORY and self.out_of_memory_at > 0
        if out_of_memory:
            fewer = max(1, self.out_of_memory_at * 3 // 4)
            pool = kv_tokens(self.info.fields)
            self.cmd = with_max_running(self.cmd, fewer, pool)
            log.error("the engine ran out of memory with %d requests in it; starting it again with --max-running %d%s",
                      self.out_of_memory_at, fewer, f" and its KV pool as it was (--kv-tokens {pool})" if pool else "")
            self.out_of_memory_at = 0
        else:
            log.error("engine exited unexpectedly (exit code %s); restarting", code)
        self.on_exit(f"the engine process exited unexpectedly (exit code {code})", blame=not out_of_memory)
        self.restarts += 1
        await self.start()

    async def stop(self, timeout_s: float) -> None:
        self.stopping = True
        self.state = EngineState.STOPPED
        if self.launched is not None:  # stopped before its first start
            abandon([self.launched])
            self.launched = None
        if self.proc is None or self.proc.returncode is not None:
            return
        self.send(m.Quit())
        try:
            await asyncio.wait_for(self.proc.wait(), timeout_s)
        except asyncio.TimeoutError:
            await self._kill()
        if self._reader:
            self._reader.cancel()

    async def _kill(self) -> None:
        if self.proc is None or self.proc.returncode is not None:
            return
        self.proc.terminate()
        try:
            await asyncio.wait_for(self.proc.wait(), 3.0)
        except asyncio.TimeoutError:
            self.proc.kill()
            await self.proc.wait()

    # ------------------------------------------------------------ output

    def send(self, msg: m.Message) -> None:
        """A line to an engine that has gone is dropped: its death is handled by the reader."""
        stdin = None if self.proc is None or self.proc.returncode is not None else self.proc.stdin
        if stdin is None or stdin.is_closing():
            return
        try:
            stdin.write((encode(msg) + "\n").encode())
        except (BrokenPipeError, ConnectionResetError, RuntimeError):
            if not self.stopping:
                log.warning("engine stdin closed while sending %s", verb(msg))


def with_max_running(cmd: list[str], n: int, pool_tokens: int | None = None) -> list[str]:
    """The engine's command with --max-running n (its own, or --slots, replaced; else added) and, given
    pool_tokens, --kv-tokens that (its own replaced): a KV pool no larger than the one that ran out of memory, so
    that what the fewer requests leave becomes room, where the memory plan would give it to a larger pool."""
    out = without(cmd, ("--max-running", "--slots") + (("--kv-tokens",) if pool_tokens else ()))
    return out + ["--max-running", str(n)] + (["--kv-tokens", str(pool_tokens)] if pool_tokens else [])


def without(cmd: list[str], options: tuple[str, ...]) -> list[str]:
    """cmd less these options and their values (as `--opt v` or `--opt=v`)."""
    out, skip = [], False
    for word in cmd:
        if skip:
            skip = False
        elif word in options:
            skip = True
        elif not word.startswith(tuple(o + "=" for o in options)):
            out.append(word)
    return out


def kv_tokens(fields: dict[str, str]) -> int | None:
    """The positions of the KV pool an engine's READY said it holds (kv_blocks x kv_block); None if it did not."""
    try:
        return int(fields["kv_blocks"]) * int(fields["kv_block"])
    except (KeyError, ValueError):
        return None
