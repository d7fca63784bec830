"""Which cached blocks the host tier copies out ahead of their eviction (engine/kvcache/host_tier.py store_ahead;
engine/loop/ahead_copies.py does it while the engine is idle): those the pool would evict first (its idle queue, then
its sessions' kept one), not yet copied; a copy ahead whose block has been taken again is let go first, its slot for
the blocks evicted next."""
from __future__ import annotations

from itertools import islice
from typing import Iterator


def not_copied(pool) -> Iterator:
    """The pool's unreferenced cached blocks in the order it evicts them (engine/kvcache/block_pool.py allocate: its
    idle queue, then its sessions' kept one), those with a copy ahead left out."""
    return (block for block in (pool.blocks[i] for i in (*pool.idle, *pool.kept)) if block.key not in pool.tier.early)


def in_use(pool, key: bytes) -> bool:
    return pool.blocks[pool.cached[key]].refs > 0


def store_ahead(pool, n: int) -> int:
    """Up to n of the blocks evicted first, not yet copied, copied into the pool's host tier now. How many."""
    if pool.tier is None:
        return 0
    pool.tier.drop_early([key for key in pool.tier.early if in_use(pool, key)])
    return pool.tier.store_ahead(islice(not_copied(pool), n))


def ahead_wanted(pool) -> bool:
    """Whether store_ahead would copy anything: a block not yet copied, and room for a copy ahead (those of blocks
    taken again are let go first)."""
    tier = pool.tier
    if tier is None:
        return False
    idle_copies = sum(1 for key in tier.early if not in_use(pool, key))
    return idle_copies < tier.ahead_limit and next(not_copied(pool), None) is not None
