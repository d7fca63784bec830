"""The host tier's copies made before an eviction needs them (engine/kvcache/copies_ahead.py): the rows of the cached
blocks the pool would evict first are copied out, BATCH blocks at a time, until half the tier holds such copies.
A burst of new requests that then evicts them copies nothing on its way in.

When: while the engine is idle (no request in it, no line for IDLE_S; a GEN that comes meanwhile waits for one batch's
copies at most, ~11 ms for 64 blocks of the 8B shape), and on a GPU also between the steps of a busy engine, a batch
once the last one has landed, since there they run on the copy engine beside the steps (engine/kvcache/host_shelf.py
put_ahead). Without the latter, 64 clients that came right after 64 others found nothing copied ahead: their
admission's 576 evicted blocks held the engine ~90 ms ahead of their reads (bench/HISTORY.md, twenty-second session).
Between steps a batch is asked for at most every CHECK_S (store_ahead walks the copies ahead: ~0.1 ms with hundreds of
them).
"""
from __future__ import annotations

import time

from engine.kvcache.copies_ahead import ahead_wanted, store_ahead

BATCH = 64  # blocks copied ahead at a time
CHECK_S = 0.05  # between steps, how often a batch is asked for at most


class AheadCopies:
    def __init__(self, pool, trace=None):
        self.pool = pool  # engine/kvcache/block_pool.py BlockPool
        self.trace = trace  # engine/loop/step_trace.py StepTrace
        self.asked = 0.0  # perf_counter of the latest ask between steps

    def pending(self) -> bool:  # (then a batch copies at least one block: ahead_wanted counts the room it makes)
        return ahead_wanted(self.pool)

    def copy_some(self) -> None:
        """A batch, where the tier wants one (store_ahead copies nothing otherwise)."""
        started = time.perf_counter()
        copied = store_ahead(self.pool, BATCH)
        if copied and self.trace is not None:
            self.trace.step("ahead", started, blocks=copied)

    def beside_steps(self) -> None:
        """Between a busy engine's steps: a batch where copies run beside them, the last batch has landed and the
        tier wants one."""
        tier, now = self.pool.tier, time.perf_counter()  # (every round: the cheap tests first)
        if tier is None or now - self.asked < CHECK_S or not tier.shelf.copies_beside_steps or tier.shelf.copying:
            return
        self.asked = now
        self.copy_some()
