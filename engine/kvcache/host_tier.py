"""The prefix cache's host tier (`--cache-ram`): cached blocks evicted from the pool keep their rows
in host memory, so that a conversation that comes back after its blocks were needed elsewhere is
copied back into the pool instead of read again.

The pool (engine/kvcache/block_pool.py) hands the tier the blocks it evicts, before their rows are overwritten,
and asks it for the rest of a chain when its own cached blocks end. An entry is found by the same
hash-chain key as in the pool, its tokens checked; it lives in one tier at a time (taken out when
copied back, dropped when the pool registers the same key again). The least recently stored
entries go first when the budget is full. The rows themselves sit in a shelf's slots
(engine/kvcache/host_shelf.py: an eviction's blocks copied out together, not a copy a block); an entry
names its slot, and a slot taken with its entry stays its own until the rows are copied back.

Copies ahead: while the engine is idle (and on a GPU between its steps too, beside them on a stream of their own),
the rows of the cached blocks the pool would evict first may be copied out already (`store_ahead`; at most half the
tier's slots): their blocks are still the pool's, their rows final, so when
one is evicted its entry is made without a copy. An eviction that comes with a burst of new requests then copies
nothing, where 576 blocks of the 8B shape (64 clients' prompts) took ~0.1 s on the copy engine ahead of their reads
(bench/HISTORY.md, twenty-first session).
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable, Protocol, Sequence


@dataclass
class HostBlock:
    tokens: tuple[int, ...]
    parent: bytes
    slot: int  # where its rows are on the shelf


class Shelf(Protocol):
    """Where the rows go (engine/kvcache/host_shelf.py HostShelf)."""

    def put(self, slots: Sequence[int], blocks: Sequence[int]) -> None: ...  # pool blocks' rows into slots

    def get(self, slots: Sequence[int], blocks: Sequence[int]) -> None: ...  # slots' rows into pool blocks

    def make_ahead(self) -> None: ...  # its memory made now, in the background, before a store needs it

    def put_ahead(self, slots: Sequence[int], blocks: Sequence[int]) -> None: ...  # put, beside the steps if it can

    def fence(self, slots: Sequence[int] = (), blocks: Sequence[int] = ()) -> None: ...  # what follows waits for
    # the copies put_ahead queued that touch these slots or blocks

    @property
    def copying(self) -> bool: ...  # copies put_ahead queued still on their way

    copies_beside_steps: bool  # put_ahead's copies run beside the steps, not in their time


class HostTier:
    @classmethod
    def sized(cls, budget_bytes: int, block_bytes: int, shelf: Callable[[int], Shelf]) -> "HostTier | None":
        """A tier of `budget_bytes` over shelf(slots), or None when that does not hold one block (no tier)."""
        if not block_bytes or budget_bytes < block_bytes:
            return None
        capacity = budget_bytes // block_bytes
        return cls(capacity, shelf(capacity))

    def __init__(self, capacity: int, shelf: Shelf):
        self.capacity, self.shelf = capacity, shelf  # blocks it may hold, their rows' slots
        self.entries: OrderedDict[bytes, HostBlock] = OrderedDict()  # least recently stored first
        self.early: dict[bytes, int] = {}  # key -> slot: rows of a block still cached in the pool, copied ahead
        self.free = list(range(capacity - 1, -1, -1))  # slots no entry holds (popped from the end: 0 first)
        self.stored = self.loaded = self.dropped = 0  # blocks: copied out, copied back, let go for room
        self.ahead = 0  # of the stored, those copied ahead of their eviction

    @property
    def ahead_limit(self) -> int:
        """Copies ahead the tier holds at most: half its slots (the rest are for blocks already evicted)."""
        return self.capacity // 2

    def store(self, blocks) -> None:
        """Evicted pool blocks (engine/kvcache/block_pool.py Block: index, key, tokens, parent still set) copied
        out, all in one go, before their rows are reused; the oldest entries make room. Slots taken with
        their entries and not yet copied back are not room. A block copied ahead becomes its entry without a copy (once
        that copy has landed: the blocks are written over next)."""
        self.shelf.fence(blocks=[block.index for block in blocks])
        rest = []
        for block in blocks:
            slot = self.early.pop(block.key, None)
            if slot is None:
                rest.append(block)
            else:
                self.entries[block.key] = HostBlock(block.tokens, block.parent, slot)
                self.stored += 1
        room = len(self.free) + len(self.entries)
        rest = rest[-room:] if room else []
        slots = []
        for block in rest:
            old = self.entries.pop(block.key, None)
            if old is not None:
                self.free.append(old.slot)
            slots.append(self._take_slot())
            self.entries[block.key] = HostBlock(block.tokens, block.parent, slots[-1])
        self._copy_out(self.shelf.put, slots, rest)
        self.stored += len(rest)

    def store_ahead(self, blocks) -> int:
        """Cached pool blocks (least recently used first) copied out before their eviction, while they are still the
        pool's (their rows final), up to ahead_limit copies ahead, the oldest entries making room. How many."""
        slots, taken = [], []
        for block in blocks:
            if len(self.early) >= self.ahead_limit:
                break
            if block.key in self.early:
                continue
            slot = self._take_slot()
            if slot is None:
                break
            self.early[block.key] = slot
            slots.append(slot)
            taken.append(block)
        self._copy_out(self.shelf.put_ahead, slots, taken)
        self.ahead += len(taken)
        return len(taken)

    def _take_slot(self) -> int | None:
        """A free slot, the oldest entry dropped for it if none is (None when no entry is left either)."""
        if not self.free:
            if not self.entries:
                return None
            self.free.append(self.entries.popitem(last=False)[1].slot)
            self.dropped += 1
        return self.free.pop()

    @staticmethod
    def _copy_out(put, slots: list[int], blocks: list) -> None:
        """The blocks' rows into these slots by the shelf's `put` (or `put_ahead`), if there are any."""
        if blocks:
            put(slots, [block.index for block in blocks])

    def drop_early(self, keys) -> None:
        """These copies ahead let go (their blocks were taken again), their slots free."""
        for key in keys:
            self.free.append(self.early.pop(key))

    def has(self, key: bytes, tokens: tuple[int, ...]) -> bool:
        entry = self.entries.get(key)
        return entry is not None and entry.tokens == tokens

    def take(self, keys: list[bytes]) -> list[HostBlock]:
        """These entries out of the tier (the caller copies them back with `load`; their slots wait for it)."""
        return [self.entries.pop(key) for key in keys]

    def load(self, indices: list[int], entries: list[HostBlock]) -> None:
        """Taken entries' rows into these pool blocks; their slots free again."""
        if not indices:
            return
        slots = [entry.slot for entry in entries]
        self.shelf.get(slots, indices)
        self.free.extend(slots)
        self.loaded += len(indices)

    def discard(self, key: bytes) -> None:
        """The pool holds this key again (a fresh read registered it): one copy is enough."""
        entry = self.entries.pop(key, None)
        if entry is not None:
            self.free.append(entry.slot)

    def status(self) -> dict[str, int]:
        return {"host_blocks": len(self.entries), "host_capacity": self.capacity, "host_loaded": self.loaded,
                "host_stored": self.stored, "host_dropped": self.dropped, "host_ahead": len(self.early),
                "host_stored_ahead": self.ahead}
