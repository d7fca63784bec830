"""Engines started before the server's start-up (serve/engine_proc/engine_launch.py): an adopted process speaks
through asyncio streams as a spawned one does, and one never adopted is ended."""
import asyncio
import sys

from serve.engine_proc.engine_launch import AdoptedProcess, abandon, launch

ECHO = [sys.executable, "-c", "import sys\nfor line in sys.stdin: print(line.strip().upper(), flush=True)"]


def test_an_adopted_process_reads_writes_and_ends_like_asyncios():
    async def scenario():
        proc = await AdoptedProcess.adopt(launch(ECHO, {"UNUSED": "1"}), limit=1 << 20)
        assert proc.returncode is None and proc.pid > 0
        proc.stdin.write(b"ready\n")
        assert await asyncio.wait_for(proc.stdout.readline(), 10) == b"READY\n"
        proc.terminate()
        code = await asyncio.wait_for(proc.wait(), 10)
        assert code == proc.returncode == -15 and proc.stdin.is_closing()
        assert await proc.stdout.readline() == b""  # end of its output
    asyncio.run(scenario())


def test_an_engine_never_adopted_is_ended():
    proc = launch(ECHO, None)
    abandon([proc])
    assert proc.returncode == -9 and proc.stdin.closed and proc.stdout.closed
    abandon([proc])  # an ended one again: nothing to do
