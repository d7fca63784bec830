"""How engine processes are started: `launch`, then adopted into the event loop (AdoptedProcess gives
a subprocess.Popen the surface of asyncio's Process that serve/engine_proc/engine_client.py uses).

The server needs a second or two before its event loop runs (FastAPI's imports, the tokenizer, the
app); an engine needs seconds to load its model. So the first engines are launched as soon as the
settings are known and adopted once the loop runs; restarts after a crash are launched by the
client. Engines never adopted (the server failed to start) are ended by `abandon`.
"""
from __future__ import annotations

import asyncio
import os
import subprocess


def launch(cmd: list[str], env: dict[str, str] | None) -> subprocess.Popen:
    """One engine process as EngineClient spawns it: pipes for the protocol, stderr shared with the
    server, its own session (a signal to the server's process group is the server's to handle)."""
    return subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True,
                            env=None if env is None else os.environ | env)


def abandon(procs: list[subprocess.Popen]) -> None:
    """End engines that no client adopted: closing stdin ends an engine once it has loaded; kill
    does not wait for that."""
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        for pipe in (proc.stdin, proc.stdout):
            pipe.close()


class AdoptedProcess:
    """A running subprocess.Popen seen as an asyncio.subprocess.Process: stdin a StreamWriter, stdout
    a StreamReader (lines up to `limit` bytes), pid, returncode, wait(), terminate(), kill()."""

    def __init__(self, popen: subprocess.Popen, stdin: asyncio.StreamWriter, stdout: asyncio.StreamReader):
        self.popen, self.stdin, self.stdout = popen, stdin, stdout

    @classmethod
    async def adopt(cls, popen: subprocess.Popen, limit: int) -> "AdoptedProcess":
        loop = asyncio.get_running_loop()
        stdout = asyncio.StreamReader(limit=limit, loop=loop)
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(stdout, loop=loop), popen.stdout)
        transport, protocol = await loop.connect_write_pipe(lambda: asyncio.streams.FlowControlMixin(loop=loop),
                                                            popen.stdin)
        return cls(popen, asyncio.StreamWriter(transport, protocol, None, loop), stdout)

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def returncode(self) -> int | None:
        return self.popen.poll()

    async def wait(self) -> int:
        while self.popen.poll() is None:  # polled, not waited in a thread: a cancelled wait leaves nothing behind
            await asyncio.sleep(0.02)
        self.stdin.close()
        return self.popen.returncode

    def terminate(self) -> None:
        if self.popen.poll() is None:
            self.popen.terminate()

    def kill(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()
