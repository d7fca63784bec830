"""Which cached blocks the host tier copies out ahead of their eviction (engine/kvcache/host_tier.py store_ahead;
engine/loop/ahead_copies.py does it while the engine is idle): those the pool would evict first (its idle queue, then
its sessions' kept one), not yet copied; a copy ahead whose block has been taken again is let go first, its slot for
the blocks evicted next."""
from __future__ import annotations

from typing import Iterator


def evicted_first(pool) -> Iterator:
    """The pool's unreferenced cached blocks in the order it evicts them (engine/kvcache/block_pool.py allocate)."""
    return (pool.blocks[i] for i in (*pool.idle, *pool.kept))


def in_use(pool, key: bytes) -> bool:
    return pool.blocks[pool.cached[key]].refs > 0


def store_ahead(pool, n: int) -> int:
    """Up to n of the blocks evicted first, not yet copied, copied into the pool's host tier now. How many."""
    tier = pool.tier
    if tier is None:
        return 0
    tier.drop_early([key for key in tier.early if in_use(pool, key)])
    candidates = []
    for block in evicted_first(pool):
        if len(candidates) == n:
            break
        if block.key not in tier.early:
            candidates.append(block)
    return tier.store_ahead(candidates)


def ahead_wanted(pool) -> bool:
    """Whether store_ahead would copy anything: blocks not yet copied, and room for copies ahead (those of blocks
    taken again are let go)."""
    tier = pool.tier
    if tier is None:
        return False
    copied = sum(1 for key in tier.early if not in_use(pool, key))
    return copied < tier.capacity // 2 and any(block.key not in tier.early for block in evicted_first(pool))
