"""One pool of fixed-size KV blocks for every request, and the prefix cache over it.

A request holds a block table: block i of its table holds its positions [i*B, (i+1)*B). Blocks
are handed out from the free list; a block whose rows a prompt-chunk read wrote in full can be
registered in the prefix cache under a hash chain key (the parent block's key and its own tokens,
the tokens kept to check collisions). A later request whose prompt starts with the same tokens
takes those blocks into its own table (a reference each) instead of reading them again. When a
block's last reference goes, a cached block waits in a least-recently-used queue (still found by
its key) and is evicted only when a block is needed and the free list is empty; an uncached one
goes back to the free list at once. Blocks let go by a request that named its client's session
(a prompt_cache_key, or an agent's session header) wait in a second queue, evicted only once the
first is empty: an agent's prefix outlives a burst of one-off requests. With a host tier
(engine/kvcache/host_tier.py, `--cache-ram`), an evicted block's rows are copied to host memory first, and
a chain that ends in the pool may go on there: those blocks are copied back into new pool blocks
instead of read again.

Only rows written by prompt reads are registered (a decode step's rows come from other kernels; an
answer is registered once read again as prompt rows, engine/loop/admission.py), so that a reused start
is bit-identical to a cold read of it: where a row's result does not depend on the step (the runner's
shape_free) whole blocks are registered and reused; elsewhere whole absolute chunks (the caller's
`upto` and `align`).
"""
from __future__ import annotations

import hashlib
from collections import OrderedDict, deque
from dataclasses import dataclass

import numpy as np

ROOT_KEY = b""  # the parent key of a prompt's first block


def block_key(parent: bytes, tokens) -> bytes:
    """The hash chain: a block's key names its tokens and every token before them."""
    h = hashlib.blake2b(parent, digest_size=16)
    h.update(np.asarray(tokens, dtype=np.int64).tobytes())
    return h.digest()


@dataclass
class Block:
    index: int
    refs: int = 0  # the block tables holding it
    key: bytes | None = None  # its prefix-cache key while registered
    tokens: tuple[int, ...] = ()  # what the key names, checked on a hit (collisions)
    parent: bytes = ROOT_KEY  # the key of the block before it in its chain


class OutOfBlocks(Exception):
    """No block is free or evictable: the caller relieves the pressure (parks, pauses) or waits."""


class BlockPool:
    def __init__(self, total: int, size: int, tier=None):
        if total < 1 or size < 1:
            raise ValueError("a block pool needs at least one block of at least one position")
        self.size, self.total = size, total
        self.blocks = [Block(i) for i in range(total)]
        self.free: deque[int] = deque(range(total))  # never-cached or evicted, unreferenced
        self.cached: dict[bytes, int] = {}  # key -> block index
        self.idle: OrderedDict[int, None] = OrderedDict()  # unreferenced cached blocks, least recent first
        self.kept: OrderedDict[int, None] = OrderedDict()  # the same, let go by a session: evicted after idle's
        self.tier = tier  # engine/kvcache/host_tier.py HostTier, or None: evicted blocks are gone
        self.hits = self.lookups = self.evictions = 0

    # ------------------------------------------------------------ counts

    def blocks_for(self, positions: int) -> int:
        return -(-positions // self.size)

    @property
    def available(self) -> int:
        """Blocks a request can have now: free ones and unreferenced cached ones (evicted on demand)."""
        return len(self.free) + len(self.idle) + len(self.kept)

    @property
    def used(self) -> int:
        """Blocks some table holds."""
        return self.total - self.available

    # ------------------------------------------------------------ tables

    def allocate(self, n: int) -> list[int]:
        """n blocks for one table (a reference each): free ones first, then the least recently used
        unreferenced cached ones, evicted. OutOfBlocks (nothing taken) if there are not enough."""
        if n > self.available:
            raise OutOfBlocks(f"{n} blocks wanted, {self.available} available")
        taken, evicted = [], []
        for _ in range(n):
            if self.free:
                index = self.free.popleft()
            else:
                index, _ = (self.idle or self.kept).popitem(last=False)
                evicted.append(self.blocks[index])
                self.evictions += 1
            self.blocks[index].refs = 1
            taken.append(index)
        if evicted and self.tier is not None:
            self.tier.store(evicted)  # their rows, before anyone writes over them
        for block in evicted:
            self._unregister(block)
        return taken

    def grow(self, table: list[int], positions: int) -> None:
        """Extend `table` in place to cover `positions`; OutOfBlocks leaves it as it was."""
        need = self.blocks_for(positions) - len(table)
        if need > 0:
            table.extend(self.allocate(need))

    def can_grow(self, table: list[int], positions: int) -> bool:
        return self.blocks_for(positions) - len(table) <= self.available

    def release(self, table: list[int], kept: bool = False) -> None:
        """A table lets its blocks go (the table is emptied): cached ones wait in the LRU queue (kept:
        a session's, the second queue), most recent last (a table's later blocks are evicted before
        its earlier ones: they are worth less, since a hit needs the whole chain before them);
        others are free at once."""
        idle = self.kept if kept else self.idle
        for index in reversed(table):
            block = self.blocks[index]
            block.refs -= 1
            if block.refs > 0:
                continue
            if block.key is not None:
                idle[index] = None
            else:
                self.free.append(index)
        table.clear()

    def truncate(self, table: list[int], positions: int) -> None:
        """Let the blocks past `positions` go (a read restarting from a chunk boundary)."""
        keep = self.blocks_for(positions)
        extra = table[keep:]
        del table[keep:]
        self.release(extra)

    # ------------------------------------------------------------ prefix cache

    def lookup(self, prompt, limit: int, align: int = 1) -> list[int]:
        """The cached chain of blocks that starts `prompt`, up to `limit` positions, in whole runs
        of `align` blocks, each taken with a reference: the pool's own blocks, then those the host
        tier has (copied back into new blocks, as many as can be had)."""
        self.lookups += 1
        found, parent, keys = [], ROOT_KEY, []  # keys: the chain's part in the host tier
        for start in range(0, limit - self.size + 1, self.size):
            tokens = tuple(prompt[start : start + self.size])
            key = block_key(parent, tokens)
            index = self.cached.get(key)
            if keys or index is None or self.blocks[index].tokens != tokens:
                if self.tier is None or not self.tier.has(key, tokens):
                    break
                keys.append(key)
            else:
                found.append(index)
            parent = key
        for index in found:
            self._ref(index)
        whole = (len(found) + min(len(keys), self.available)) // align * align
        self.release(found[whole:])  # (release empties the list it is given)
        found = found[:whole]
        keys = keys[: whole - len(found)]
        if keys:
            entries = self.tier.take(keys)
            indices = self.allocate(len(keys))
            self.tier.load(indices, entries)
            for index, key, entry in zip(indices, keys, entries):
                block = self.blocks[index]
                block.key, block.tokens, block.parent = key, entry.tokens, entry.parent
                self.cached[key] = index
            found += indices
        if found:
            self.hits += 1
        return found

    def register(self, table: list[int], prompt, upto: int) -> list[bytes]:
        """The table's blocks below `upto` (a multiple of the block size) hold rows a prompt-chunk
        read wrote in full: make them findable. A block whose key another block already holds
        stays unregistered (it is freed with its table). Returns their chain's keys, in order."""
        parent, keys = ROOT_KEY, []
        for i in range(min(upto // self.size, len(table))):
            block = self.blocks[table[i]]
            tokens = tuple(prompt[i * self.size : (i + 1) * self.size])
            if block.key is None:
                key = block_key(parent, tokens)
                if key not in self.cached:
                    block.key, block.tokens, block.parent = key, tokens, parent
                    self.cached[key] = block.index
                    if self.tier is not None:
                        self.tier.discard(key)
                parent = key
            else:
                parent = block.key
            keys.append(parent)
        return keys

    def _ref(self, index: int) -> None:
        block = self.blocks[index]
        if block.refs == 0:
            self.idle.pop(index, None)
            self.kept.pop(index, None)
        block.refs += 1

    def _unregister(self, block: Block) -> None:
        if block.key is not None and self.cached.get(block.key) == block.index:
            del self.cached[block.key]
        block.key, block.tokens, block.parent = None, (), ROOT_KEY

    def status(self) -> dict[str, int]:
        out = {"total": self.total, "used": self.used, "cached": len(self.cached), "idle": len(self.idle),
               "kept": len(self.kept), "free": len(self.free), "block_size": self.size}
        return out | (self.tier.status() if self.tier is not None else {})

    def check(self, tables: list[list[int]]) -> None:
        """Invariants (tests): every block is exactly one of free / idle / kept / referenced; reference
        counts equal the tables holding them; a registered block's key is its tokens' chain."""
        refs = [0] * self.total
        for table in tables:
            for index in table:
                refs[index] += 1
        for block in self.blocks:
            assert block.refs == refs[block.index], (block, refs[block.index])
            states = (block.index in self.free, block.index in self.idle, block.index in self.kept, block.refs > 0)
            assert sum(states) == 1, (block, states)
            if block.index in self.idle or block.index in self.kept:
                assert block.key is not None
            if block.key is not None:
                assert self.cached.get(block.key) == block.index
                assert len(block.tokens) == self.size and block.key == block_key(block.parent, block.tokens)
        assert len(self.free) == len(set(self.free))
        if self.tier is not None:  # a key lives in one tier; the host's within its budget, its chains named right
            assert not set(self.tier.entries) & set(self.cached)
            assert len(self.tier.entries) <= self.tier.capacity
            for key, entry in self.tier.entries.items():
                assert key == block_key(entry.parent, entry.tokens)
            slots = [entry.slot for entry in self.tier.entries.values()] + self.tier.free  # (none taken between calls)
            slots += list(self.tier.early.values())  # (copies ahead: of blocks still cached here)
            assert sorted(slots) == list(range(self.tier.capacity))
            assert set(self.tier.early) <= set(self.cached) and len(self.tier.early) <= self.tier.ahead_limit
