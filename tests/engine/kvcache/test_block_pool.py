"""The block pool and its prefix cache (engine/kvcache/block_pool.py): a hypothesis state machine of tables that
take blocks, grow, register their whole chunks, look up shared prefixes and let go, with the pool's
invariants checked after every step (no block both free and referenced, reference counts equal the
tables holding them, a cached block's key is its tokens' chain), over a host tier that keeps evicted
blocks' rows and copies them back (a block's rows always equal the tokens its key names)."""
from hypothesis import settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import pytest

import numpy as np

from engine.kvcache.block_pool import BlockPool, OutOfBlocks, block_key
from engine.kvcache.host_shelf import HostShelf
from engine.kvcache.copies_ahead import ahead_wanted, store_ahead
from engine.kvcache.host_tier import HostTier

SIZE = 4
PREFIXES = [tuple(range(100, 140)), tuple(range(200, 240))]  # two system prompts many requests share


def prompt_strategy():
    head = st.sampled_from(PREFIXES).flatmap(lambda p: st.integers(0, len(p)).map(lambda n: p[:n]))
    tail = st.lists(st.integers(0, 9), max_size=12).map(tuple)
    return st.tuples(head, tail).map(lambda ht: ht[0] + ht[1]).filter(lambda p: len(p) >= 1)


class FakeRows:
    """KV rows standing for the tokens they were written for: (1, blocks, 1, SIZE, 1)."""

    def __init__(self, blocks: int):
        self.rows = np.full((1, blocks, 1, SIZE, 1), -1, dtype=np.int64)

    def tier(self, capacity: int) -> HostTier:
        """A host tier of `capacity` blocks over these rows."""
        return HostTier(capacity, HostShelf([self.rows], capacity, chunk=4))  # (chunks of 4: runs cross them)

    def tokens(self, index: int) -> tuple[int, ...]:
        return tuple(int(t) for t in self.rows[0, index, 0, :, 0])


class PoolMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.kv = FakeRows(24)
        self.pool = BlockPool(24, SIZE, self.kv.tier(6))
        self.tables: dict[int, tuple[list[int], tuple[int, ...]]] = {}  # id -> (table, prompt)
        self.next_id = 0

    @rule(prompt=prompt_strategy(), align=st.sampled_from([1, 2]))
    def admit(self, prompt, align):
        limit = (len(prompt) - 1) // SIZE * SIZE
        found = self.pool.lookup(prompt, limit, align)
        assert len(found) % align == 0
        for i, index in enumerate(found):  # a hit is the very tokens, at the very place in the chain
            assert self.pool.blocks[index].tokens == tuple(prompt[i * SIZE : (i + 1) * SIZE])
            assert self.kv.tokens(index) == self.pool.blocks[index].tokens  # and its rows are theirs
        reused = len(found)
        try:
            self.pool.grow(found, len(prompt))
        except OutOfBlocks:
            self.pool.release(found)
            return
        for i, index in enumerate(found[reused:], start=reused):  # the read writes the rest's rows
            part = prompt[i * SIZE : (i + 1) * SIZE]
            self.kv.rows[0, index, 0, :, 0] = tuple(part) + (-1,) * (SIZE - len(part))
        self.tables[self.next_id] = (found, prompt)
        self.next_id += 1

    @precondition(lambda self: self.tables)
    @rule(data=st.data())
    def register(self, data):
        ident = data.draw(st.sampled_from(sorted(self.tables)))
        table, prompt = self.tables[ident]
        self.pool.register(table, prompt, len(prompt) // SIZE * SIZE)

    @precondition(lambda self: self.tables)
    @rule(data=st.data(), more=st.integers(1, 9))
    def grow(self, data, more):
        ident = data.draw(st.sampled_from(sorted(self.tables)))
        table, prompt = self.tables[ident]
        before = list(table)
        try:
            self.pool.grow(table, len(table) * SIZE + more)
        except OutOfBlocks:
            assert table == before  # a refusal takes nothing

    @precondition(lambda self: self.tables)
    @rule(data=st.data(), kept=st.booleans())
    def release(self, data, kept):
        ident = data.draw(st.sampled_from(sorted(self.tables)))
        table, _ = self.tables.pop(ident)
        self.pool.release(table, kept=kept)  # kept: a session's blocks
        assert table == []

    @rule(n=st.integers(0, 4))
    def copy_ahead(self, n):  # (the engine's idle rounds)
        store_ahead(self.pool, n)

    @invariant()
    def consistent(self):
        self.pool.check([t for t, _ in self.tables.values()])
        assert self.pool.used + self.pool.available == self.pool.total
        for index in self.pool.cached.values():
            assert self.kv.tokens(index) == self.pool.blocks[index].tokens
        for entry in self.pool.tier.entries.values():  # a host copy holds its own tokens' rows
            (rows,) = self.pool.tier.shelf.rows(entry.slot)
            assert tuple(int(t) for t in rows[0, 0, :, 0]) == entry.tokens
        for key, slot in self.pool.tier.early.items():  # and a copy ahead its block's
            (rows,) = self.pool.tier.shelf.rows(slot)
            assert tuple(int(t) for t in rows[0, 0, :, 0]) == self.pool.blocks[self.pool.cached[key]].tokens


TestPoolMachine = PoolMachine.TestCase
TestPoolMachine.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)


def test_a_released_prefix_stays_findable_until_its_room_is_needed():
    pool = BlockPool(4, SIZE)
    prompt = tuple(range(12))
    table = pool.allocate(3)
    kept = list(table)
    pool.register(table, prompt, 12)
    pool.release(table)
    assert pool.available == 4 and len(pool.cached) == 3  # idle, still cached
    again = pool.lookup(prompt + (99,), 12)
    assert again == kept and pool.hits == 1
    pool.release(again)
    taken = pool.allocate(2)  # the one free block, then the least recently used idle one, evicted
    assert pool.evictions == 1 and len(pool.cached) == 2 and kept[2] in taken
    pool.release(taken)
    assert pool.lookup(prompt + (99,), 12) == kept[:2]


def test_the_later_blocks_of_a_chain_are_evicted_first():
    pool = BlockPool(3, SIZE)
    prompt = tuple(range(12))
    table = pool.allocate(3)
    pool.register(table, prompt, 12)
    first = table[0]
    pool.release(table)
    pool.allocate(2)  # two evictions: the chain's tail goes, its head stays findable
    assert pool.lookup(prompt, 12) == [first]


def test_a_session_s_prefix_outlives_one_off_requests():
    """Blocks let go by a request that named its session are evicted only after every one-off
    request's, whatever their age."""
    pool = BlockPool(4, SIZE)
    agent, other = tuple(range(8)), tuple(range(50, 58))
    table = pool.allocate(2)
    pool.register(table, agent, 8)
    pool.release(table, kept=True)  # the agent's turn ends first: its blocks are the oldest
    table = pool.allocate(2)
    pool.register(table, other, 8)
    pool.release(table)
    assert pool.status()["kept"] == 2 and pool.status()["idle"] == 2
    pool.release(pool.allocate(2))  # a burst needs two blocks: the one-off request's go
    assert len(pool.lookup(agent, 8)) == 2 and pool.lookup(other, 8) == []


def test_a_collision_is_not_a_hit():
    pool = BlockPool(2, SIZE)
    table = pool.allocate(1)
    pool.register(table, (1, 2, 3, 4), 4)
    pool.blocks[table[0]].tokens = (9, 9, 9, 9)  # as if another chain had the same key
    assert pool.lookup((1, 2, 3, 4, 5), 4) == []


def test_keys_chain_their_parents():
    a, b = block_key(b"", (1, 2, 3, 4)), block_key(b"", (5, 6, 7, 8))
    assert block_key(a, (5, 6, 7, 8)) != b  # the same tokens after a different start are another block


def test_asking_more_than_the_pool_is_refused_whole():
    pool = BlockPool(2, SIZE)
    with pytest.raises(OutOfBlocks):
        pool.allocate(3)
    assert pool.available == 2


def released_prompt(blocks: int, prompt_blocks: int, tier: int):
    """A pool of `blocks` over a host tier of `tier` slots, a prompt of `prompt_blocks` whole blocks read, registered
    and let go (cached, unreferenced): (its rows, the pool, the prompt, its blocks)."""
    kv = FakeRows(blocks)
    pool = BlockPool(blocks, SIZE, kv.tier(tier))
    prompt = tuple(range(prompt_blocks * SIZE))
    table = pool.allocate(prompt_blocks)
    held = list(table)
    kv.rows[0, table, 0, :, 0] = np.asarray(prompt).reshape(prompt_blocks, SIZE)
    pool.register(table, prompt, len(prompt))
    pool.release(table)
    return kv, pool, prompt, held


def test_an_evicted_prefix_comes_back_from_the_host_tier_by_copy():
    kv, pool, prompt, _ = released_prompt(3, 3, tier=4)
    other = pool.allocate(3)  # all three evicted into the tier, their rows overwritten next
    kv.rows[0, other, 0, :, 0] = 7
    assert pool.tier.stored == 3 and not pool.cached
    pool.release(other)
    back = pool.lookup(prompt + (99,), 12, align=2)  # a chunk of two blocks: two come back, not three
    assert len(back) == 2 and pool.tier.loaded == 2 and len(pool.tier.entries) == 1
    assert [kv.tokens(i) for i in back] == [prompt[:4], prompt[4:8]]
    pool.check([back])


def test_blocks_copied_ahead_are_evicted_without_a_copy_and_come_back_right():
    kv, pool, prompt, _ = released_prompt(4, 4, tier=4)
    assert ahead_wanted(pool) and store_ahead(pool, 8) == 2  # half the tier at most: the two evicted first
    assert not ahead_wanted(pool) and pool.tier.ahead == 2
    copies = []
    put = pool.tier.shelf.put
    pool.tier.shelf.put = lambda slots, blocks: (copies.append(list(blocks)), put(slots, blocks))
    other = pool.allocate(3)  # three evicted: the two copied ahead make their entries without a copy
    assert copies == [[other[2]]] and pool.tier.stored == 3 and len(pool.tier.entries) == 3
    kv.rows[0, other, 0, :, 0] = 7
    pool.release(other)
    pool.check([])
    back = pool.lookup(prompt + (99,), 16)
    assert [kv.tokens(i) for i in back] == [prompt[i * SIZE:(i + 1) * SIZE] for i in range(4)]


def test_a_copy_ahead_whose_block_is_taken_again_gives_its_slot_up():
    _, pool, prompt, table = released_prompt(4, 2, tier=2)
    assert store_ahead(pool, 2) == 1 and not ahead_wanted(pool)  # one slot of two: the later block (evicted first)
    assert list(pool.tier.early) == [pool.blocks[table[1]].key]
    again = pool.lookup(prompt + (99,), 8)  # both taken again
    pool.release(again[:1])  # the first idle again, the copied one still in use
    assert ahead_wanted(pool) and store_ahead(pool, 2) == 1  # the in-use block's copy let go, the idle one copied
    assert list(pool.tier.early) == [pool.blocks[again[0]].key]
    pool.check([again[1:]])
