"""Where the server's event loop stalls, for finding what delays streamed tokens: with $STRATA_STALL_MS set (e.g. 30),
a watch thread notes each time the loop has not come back for that long and prints, once a stall, the loop thread's
stack at that moment to stderr ("strata-stall"). Off by default (no thread, no task)."""
from __future__ import annotations

import asyncio
import os
import sys
import threading
import time
import traceback


class StallWatch:
    def __init__(self, stall_ms: float):
        self.stall_s = stall_ms / 1000
        self.beat = time.perf_counter()
        self.loop_thread = threading.get_ident()
        self.stopped = threading.Event()
        self.task: asyncio.Task | None = None  # the heartbeat (held: the loop keeps only a weak reference)

    def stop(self) -> None:
        self.stopped.set()
        if self.task is not None:
            self.task.cancel()

    async def heartbeat(self) -> None:
        """On the loop: the time it last ran, renewed a few times a stall's length."""
        while not self.stopped.is_set():
            self.beat = time.perf_counter()
            await asyncio.sleep(self.stall_s / 4)

    def watch(self) -> None:
        """In its own thread: the loop thread's stack once a stall (the heartbeat older than stall_ms)."""
        reported = None
        while not self.stopped.wait(self.stall_s / 4):
            beat = self.beat
            late = time.perf_counter() - beat
            if late < self.stall_s or reported == beat:
                continue
            reported = beat
            frame = sys._current_frames().get(self.loop_thread)
            stack = "".join(traceback.format_stack(frame, limit=24)) if frame is not None else "(no frame)\n"
            print(f"strata-stall {late * 1000:.0f} ms so far, the loop in:\n{stack}", file=sys.stderr, flush=True)


def start_stall_watch() -> StallWatch | None:
    """On the loop, at start-up: the watch where $STRATA_STALL_MS asks for it, else None."""
    stall_ms = float(os.environ.get("STRATA_STALL_MS", "0") or 0)
    if stall_ms <= 0:
        return None
    watch = StallWatch(stall_ms)
    watch.task = asyncio.get_running_loop().create_task(watch.heartbeat())  # (on the loop's thread, as __init__ ran)
    threading.Thread(target=watch.watch, name="stall-watch", daemon=True).start()
    return watch
