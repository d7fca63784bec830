"""The host tier's copies made while the engine is idle (engine/loop/ahead_copies.py): once a request is done and no
line comes, its cached blocks' rows are copied out ahead of their eviction; a request that then evicts them copies
nothing, and the first request's prompt comes back from the tier with its very tokens. The engine's loop in this
process over the real runner and a small synthetic model of the default model's type, a pool of 16 blocks."""

import pytest

from engine.loop.loop import EngineLoop
from engine.loop.park_policy import ParkPolicy
from protocol import messages as m
from tests.engine.loop.hybrid_runner import SMALL_BLOCK, serve_until_idle, small_runner, tokens

BLOCK = SMALL_BLOCK
GREEDY = {"temperature": 0.0, "seed": 0}
A = tuple(range(300, 364))  # four blocks
B = tuple(range(1000, 1000 + 15 * BLOCK))  # with its answer's, the pool's sixteen blocks: A's four evicted


@pytest.fixture(scope="module")
def runner(small_q4_1):
    return small_runner(small_q4_1, blocks=16, cache_ram_bytes=1 << 30)


def test_an_idle_engine_copies_its_cached_blocks_out_and_an_eviction_then_copies_nothing(runner):
    out: list = []
    loop = EngineLoop(runner, ParkPolicy(), out.append)
    pool, shelf = runner.pool, runner.pool.tier.shelf
    serve_until_idle(loop, [m.Gen(4, A, GREEDY, 1)], [], out)
    first = tokens(out, 1)
    cached = set(pool.cached)
    assert len(cached) >= 4 and not pool.tier.early
    while (work := loop.idle_work()) is not None:  # (the idle rounds, no line coming)
        work()
    assert set(pool.tier.early) == cached and pool.tier.ahead == len(cached)
    puts = []
    put = shelf.put
    shelf.put = lambda slots, blocks: (puts.append(list(blocks)), put(slots, blocks))
    serve_until_idle(loop, [m.Gen(4, B, {**GREEDY, "reuse": 0}, 2)], [], out)
    assert pool.evictions >= 4 and puts == []  # A's blocks evicted, every one copied before
    serve_until_idle(loop, [m.Gen(4, A, GREEDY, 3)], [], out)
    info = next(x for x in out if isinstance(x, m.Info) and x.id == 3)
    assert int(info.fields["from_host"]) == int(info.fields["cached"]) >= 3 * BLOCK  # back by copy, not read again
    assert tokens(out, 3) == first
    pool.check([])


@pytest.fixture()
def beside_runner(small_q4_1, monkeypatch):
    """A fresh runner whose shelf says its copies run beside the steps (as a GPU's do), asked every round."""
    import engine.loop.ahead_copies as ahead_copies

    monkeypatch.setattr(ahead_copies, "CHECK_S", 0.0)
    runner = small_runner(small_q4_1, blocks=16, cache_ram_bytes=1 << 30)
    runner.pool.tier.shelf.copies_beside_steps = True
    return runner


def test_where_copies_run_beside_the_steps_a_busy_engine_copies_ahead_between_them(beside_runner):
    out: list = []
    runner = beside_runner
    loop = EngineLoop(runner, ParkPolicy(), out.append)
    pool, shelf = runner.pool, runner.pool.tier.shelf
    serve_until_idle(loop, [m.Gen(4, A, GREEDY, 1)], [], out)  # rounds only: no idle work in between
    first = tokens(out, 1)
    assert set(pool.tier.early) == set(pool.cached) and len(pool.cached) >= 4
    puts = []
    put = shelf.put
    shelf.put = lambda slots, blocks: (puts.append(list(blocks)), put(slots, blocks))
    serve_until_idle(loop, [m.Gen(4, B, {**GREEDY, "reuse": 0}, 2)], [], out)
    assert pool.evictions >= 4 and puts == []
    serve_until_idle(loop, [m.Gen(4, A, GREEDY, 3)], [], out)
    info = next(x for x in out if isinstance(x, m.Info) and x.id == 3)
    assert int(info.fields["from_host"]) == int(info.fields["cached"]) >= 3 * BLOCK
    assert tokens(out, 3) == first
    pool.check([])
