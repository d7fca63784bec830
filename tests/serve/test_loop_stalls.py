"""The event loop's stall watch (serve/loop_stalls.py): with $STRATA_STALL_MS set, a loop held past it is reported once,
with the loop thread's stack naming what held it; unset, no watch runs."""
import asyncio
import time

from serve.loop_stalls import start_stall_watch


def hold_the_loop(seconds: float) -> None:
    time.sleep(seconds)  # (a callback that never yields)


def test_a_held_loop_is_reported_once_with_what_held_it(monkeypatch, capsys):
    monkeypatch.setenv("STRATA_STALL_MS", "20")

    async def main():
        watch = start_stall_watch()
        await asyncio.sleep(0.05)
        hold_the_loop(0.15)
        await asyncio.sleep(0.05)
        watch.stop()

    asyncio.run(main())
    reports = capsys.readouterr().err.split("strata-stall")[1:]
    assert sum("hold_the_loop" in r for r in reports) == 1  # (a busy machine may add stalls of its own elsewhere)


def test_no_watch_unless_asked(monkeypatch):
    monkeypatch.delenv("STRATA_STALL_MS", raising=False)

    async def main():
        return start_stall_watch()

    assert asyncio.run(main()) is None
