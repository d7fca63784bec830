"""The block pool and its prefix cache (engine/blocks.py): a hypothesis state machine of tables that
take blocks, grow, register their whole chunks, look up shared prefixes and let go, with the pool's
invariants checked after every step (no block both free and referenced, reference counts equal the
tables holding them, a cached block's key is its tokens' chain)."""
from hypothesis import settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import pytest

from engine.blocks import BlockPool, OutOfBlocks, block_key

SIZE = 4
PREFIXES = [tuple(range(100, 140)), tuple(range(200, 240))]  # two system prompts many requests share


def prompt_strategy():
    head = st.sampled_from(PREFIXES).flatmap(lambda p: st.integers(0, len(p)).map(lambda n: p[:n]))
    tail = st.lists(st.integers(0, 9), max_size=12).map(tuple)
    return st.tuples(head, tail).map(lambda ht: ht[0] + ht[1]).filter(lambda p: len(p) >= 1)


class PoolMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.pool = BlockPool(24, SIZE)
        self.tables: dict[int, tuple[list[int], tuple[int, ...]]] = {}  # id -> (table, prompt)
        self.next_id = 0

    @rule(prompt=prompt_strategy())
    def admit(self, prompt):
        limit = (len(prompt) - 1) // SIZE * SIZE
        found = self.pool.lookup(prompt, limit)
        for i, index in enumerate(found):  # a hit is the very tokens, at the very place in the chain
            assert self.pool.blocks[index].tokens == tuple(prompt[i * SIZE : (i + 1) * SIZE])
        try:
            self.pool.grow(found, len(prompt))
        except OutOfBlocks:
            self.pool.release(found)
            return
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
    @rule(data=st.data())
    def release(self, data):
        ident = data.draw(st.sampled_from(sorted(self.tables)))
        table, _ = self.tables.pop(ident)
        self.pool.release(table)
        assert table == []

    @invariant()
    def consistent(self):
        self.pool.check([t for t, _ in self.tables.values()])
        assert self.pool.used + self.pool.available == self.pool.total


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
