"""The host tier's copies an idle engine makes before an eviction needs them (engine/kvcache/copies_ahead.py): when
no request is in the engine and no line has come for IDLE_S, the rows of the cached blocks the pool would evict first
are copied out, BATCH blocks at a time, until half the tier holds such copies. A burst of new
requests that then evicts them copies nothing on its way in (576 blocks of the 8B shape, 64 clients' prompts, took
~0.1 s of the copy engine ahead of their reads: bench/HISTORY.md, twenty-first session). A GEN that comes meanwhile
waits for one batch's copies at most (on a GPU they are queued on the stream, ~11 ms for 64 blocks of the 8B shape).
"""
from __future__ import annotations

from engine.kvcache.copies_ahead import ahead_wanted, store_ahead

BATCH = 64  # blocks copied ahead at a time


class AheadCopies:
    def __init__(self, pool):
        self.pool = pool  # engine/kvcache/block_pool.py BlockPool

    def pending(self) -> bool:  # (then a batch copies at least one block: ahead_wanted counts the room it makes)
        return ahead_wanted(self.pool)

    def copy_some(self) -> None:
        store_ahead(self.pool, BATCH)
