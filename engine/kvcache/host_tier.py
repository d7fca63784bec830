"""The prefix cache's host tier (`--cache-ram`): cached blocks evicted from the pool keep their rows
in host memory, so that a conversation that comes back after its blocks were needed elsewhere is
copied back into the pool instead of read again.

The pool (engine/kvcache/block_pool.py) hands the tier the blocks it evicts, before their rows are overwritten,
and asks it for the rest of a chain when its own cached blocks end. An entry is found by the same
hash-chain key as in the pool, its tokens checked; it lives in one tier at a time (taken out when
copied back, dropped when the pool registers the same key again). The least recently stored
entries go first when the budget is full.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from engine.core.kv_types import stack


@dataclass
class HostBlock:
    tokens: tuple[int, ...]
    parent: bytes
    k: np.ndarray  # (layers, kv_heads, block_size, d): one block's rows, a private host copy
    v: np.ndarray


# read(indices) -> (k, v) host copies of those pool blocks, each (layers, n, kv_heads, block_size, d);
# write(indices, k, v) copies such arrays into those pool blocks
ReadBlocks = Callable[[Sequence[int]], tuple[np.ndarray, np.ndarray]]
WriteBlocks = Callable[[Sequence[int], np.ndarray, np.ndarray], None]


class HostTier:
    @classmethod
    def sized(cls, budget_bytes: int, block_bytes: int, read: ReadBlocks, write: WriteBlocks) -> "HostTier | None":
        """A tier of `budget_bytes`, or None when that does not hold one block (no tier)."""
        return cls(budget_bytes, block_bytes, read, write) if block_bytes and budget_bytes >= block_bytes else None

    def __init__(self, budget_bytes: int, block_bytes: int, read: ReadBlocks, write: WriteBlocks):
        self.capacity = budget_bytes // block_bytes if block_bytes else 0  # blocks it may hold
        self.block_bytes, self.read, self.write = block_bytes, read, write
        self.entries: OrderedDict[bytes, HostBlock] = OrderedDict()  # least recently stored first
        self.stored = self.loaded = self.dropped = 0  # blocks: copied out, copied back, let go for room

    def store(self, blocks) -> None:
        """Evicted pool blocks (engine/kvcache/block_pool.py Block: index, key, tokens, parent still set) copied
        out before their rows are reused; the oldest entries make room."""
        if not self.capacity or not blocks:
            return
        for block in list(blocks)[-self.capacity :]:
            k, v = self.read([block.index])  # one copy a block: an entry owns exactly its own rows
            self.entries.pop(block.key, None)
            self.entries[block.key] = HostBlock(block.tokens, block.parent, k[:, 0], v[:, 0])
            self.stored += 1
        while len(self.entries) > self.capacity:
            self.entries.popitem(last=False)
            self.dropped += 1

    def has(self, key: bytes, tokens: tuple[int, ...]) -> bool:
        entry = self.entries.get(key)
        return entry is not None and entry.tokens == tokens

    def take(self, keys: list[bytes]) -> list[HostBlock]:
        """These entries out of the tier (the caller copies them back with `load`)."""
        return [self.entries.pop(key) for key in keys]

    def load(self, indices: list[int], entries: list[HostBlock]) -> None:
        """Taken entries' rows into these pool blocks (one copy)."""
        if not indices:
            return
        self.write(indices, stack([e.k for e in entries], axis=1), stack([e.v for e in entries], axis=1))
        self.loaded += len(indices)

    def discard(self, key: bytes) -> None:
        """The pool holds this key again (a fresh read registered it): one copy is enough."""
        self.entries.pop(key, None)

    def status(self) -> dict[str, int]:
        return {"host_blocks": len(self.entries), "host_capacity": self.capacity, "host_loaded": self.loaded,
                "host_stored": self.stored, "host_dropped": self.dropped}
