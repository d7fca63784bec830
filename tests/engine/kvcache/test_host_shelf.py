"""The host tier's shelf (engine/kvcache/host_shelf.py): pool blocks copied into slots and back in runs, every
row in its place whatever the order of blocks and slots, chunks made only as slots are used, or ahead by a thread
of their own (each made once, a chunk needed first waited for, one the thread failed to make made where needed);
a q8_0 pool's shelf carries both of its parts; and, over a stand-in for CuPy's streams, copies ahead queued on a stream
of their own behind the steps' and every later write waiting for them."""
import ctypes
import threading
import time
from types import SimpleNamespace

import numpy as np
from hypothesis import given, settings, strategies as st

from engine.kvcache.host_shelf import HostShelf, runs

LAYERS, BLOCKS, ROW = 3, 12, (2, 4)


def pool(seed: int) -> np.ndarray:
    """(layers, blocks, *row) of distinct values."""
    return np.random.default_rng(seed).permutation(LAYERS * BLOCKS * 8).reshape(LAYERS, BLOCKS, *ROW)


def test_runs_join_consecutive_pairs_within_a_chunk():
    assert runs([4, 5, 6, 9, 10], [0, 1, 2, 3, 4], chunk=64) == [(4, 0, 3), (9, 3, 2)]
    assert runs([4, 5, 6], [2, 3, 4], chunk=4) == [(4, 2, 2), (6, 4, 1)]  # slot 4 opens the next chunk
    assert runs([5, 4], [0, 1], chunk=64) == [(5, 0, 1), (4, 1, 1)]  # blocks going down: no run
    assert runs([], [], chunk=4) == []


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_blocks_come_back_as_they_went(data):
    keys, values = pool(0), pool(1)
    shelf = HostShelf([keys, values], capacity=10, chunk=4)
    blocks = data.draw(st.lists(st.integers(0, BLOCKS - 1), min_size=1, max_size=10, unique=True))
    slots = data.draw(st.permutations(range(10)))[: len(blocks)]
    shelf.put(slots, blocks)
    for slot, block in zip(slots, blocks):
        k, v = shelf.rows(slot)
        assert (k == keys[:, block]).all() and (v == values[:, block]).all()
    before_k, before_v = keys.copy(), values.copy()
    keys[:], values[:] = -1, -1  # the pool's rows written over, as by the blocks' next owners
    back = data.draw(st.permutations(range(BLOCKS)))[: len(blocks)]  # copied back to other blocks
    shelf.get(slots, back)
    for block, new in zip(blocks, back):
        assert (keys[:, new] == before_k[:, block]).all() and (values[:, new] == before_v[:, block]).all()
    untouched = sorted(set(range(BLOCKS)) - set(back))
    assert (keys[:, untouched] == -1).all()


def test_chunks_are_made_as_slots_are_first_used():
    keys = pool(2)
    shelf = HostShelf([keys], capacity=12, chunk=4)
    assert shelf.nbytes == 0
    shelf.put([5], [0])
    assert shelf.nbytes == keys[:, :4].nbytes  # one chunk of four slots
    shelf.put([0, 11], [1, 2])
    assert shelf.nbytes == 3 * keys[:, :4].nbytes


class SlowShelf(HostShelf):
    """Chunks that take a while to make (as page-locking does), counted; the maker thread fails at `fail_at`."""

    def __init__(self, *args, fail_at: int | None = None, **kw):
        super().__init__(*args, **kw)
        self.calls: list[str] = []
        self.fail_at = fail_at

    def _host(self, shape, dtype):
        maker = threading.current_thread() is self.maker
        if maker and len(self.calls) == self.fail_at:
            raise MemoryError("no page-locked memory left")
        self.calls.append("maker" if maker else "caller")
        time.sleep(0.02)
        return super()._host(shape, dtype)


def test_chunks_made_ahead_are_made_once_and_a_chunk_needed_first_is_waited_for():
    keys = pool(4)
    shelf = SlowShelf([keys], capacity=12, chunk=4)
    shelf.make_ahead()
    shelf.put([11], [3])  # the last chunk, needed before the thread has made it: waited for, not made here too
    assert (shelf.rows(11)[0] == keys[:, 3]).all()
    shelf.maker.join(5)
    assert shelf.calls == ["maker"] * 3 and shelf.nbytes == 3 * keys[:, :4].nbytes


def test_a_chunk_the_maker_failed_to_make_is_made_where_it_is_needed(capsys):
    keys = pool(5)
    shelf = SlowShelf([keys], capacity=12, chunk=4, fail_at=1)
    shelf.make_ahead()
    shelf.maker.join(5)
    assert "could not be made ahead (MemoryError" in capsys.readouterr().err
    shelf.put([0, 5, 9], [1, 2, 3])
    assert shelf.calls == ["maker", "caller", "caller"]
    for slot, block in ((0, 1), (5, 2), (9, 3)):
        assert (shelf.rows(slot)[0] == keys[:, block]).all()


def test_a_q8_0_pools_shelf_carries_values_and_scales(loaded):
    from engine.kvcache.kv import KVCache

    kv = KVCache(loaded.cfg, 256, loaded.backend, 16, 8, kv_type="q8_0")
    rng = np.random.default_rng(3)
    for part in (kv.keys.q, kv.values.q):
        part[:] = rng.integers(-127, 128, part.shape)
    for part in (kv.keys.scale, kv.values.scale):
        part[:] = rng.random(part.shape)
    shelf = kv.shelf(4)
    assert len(shelf.pools) == 4
    shelf.put([0, 1], [6, 2])
    expect = [part[:, [6, 2]].copy() for part in shelf.pools]
    shelf.get([0, 1], [3, 4])
    for part, rows in zip(shelf.pools, expect):
        assert (part[:, [3, 4]] == rows).all()


class Event:
    def __init__(self, stream: str):
        self.stream, self.done = stream, False  # (a test says when it has landed)


class Stream:
    """CuPy's stream by the few names the shelf uses, over FakeCuda's log: its copies run at once (in stream order
    trivially), what each copy, record and wait was queued on written down."""

    def __init__(self, cuda: "FakeCuda", name: str):
        self.cuda, self.name, self.ptr = cuda, name, len(cuda.streams)
        cuda.streams.append(self)

    def record(self) -> Event:
        self.cuda.log.append(("record", self.name))
        self.cuda.events.append(Event(self.name))
        return self.cuda.events[-1]

    def wait_event(self, event: Event) -> None:
        self.cuda.log.append(("wait", self.name, event.stream))

    def synchronize(self) -> None:
        pass

    def __enter__(self):
        self.cuda.current.append(self)

    def __exit__(self, *exc):
        self.cuda.current.pop()


class FakeCuda:
    """cupy.cuda's names the shelf calls on a GPU: page-locked memory a bytearray, strided copies done at once with
    memmove, each logged with its stream."""

    def __init__(self):
        self.log: list[tuple] = []
        self.events: list[Event] = []
        self.streams: list[Stream] = []
        self.current = [Stream(self, "main")]
        self.runtime = self
        self.memcpyDeviceToHost, self.memcpyHostToDevice = "out", "in"

    def get_current_stream(self) -> Stream:
        return self.current[-1]

    def Stream(self, non_blocking: bool) -> Stream:  # noqa: N802 (CuPy's name)
        assert non_blocking  # (a stream that waits for no other implicitly)
        return Stream(self, "side")

    def alloc_pinned_memory(self, size: int) -> bytearray:
        return bytearray(size)

    def memcpy2DAsync(self, dptr, dpitch, sptr, spitch, width, height, kind, stream):  # noqa: N802
        for row in range(height):
            ctypes.memmove(dptr + row * dpitch, sptr + row * spitch, width)
        self.log.append(("copy", self.streams[stream].name, kind))


def gpu_shelf(pools, capacity: int):
    cuda = FakeCuda()
    return HostShelf(pools, capacity, xp=SimpleNamespace(cuda=cuda), chunk=4), cuda


def test_copies_ahead_go_beside_the_steps_and_only_what_touches_them_waits_for_them():
    keys = pool(6)
    shelf, cuda = gpu_shelf([keys], capacity=8)
    assert shelf.on_gpu and shelf.copies_beside_steps
    shelf.put_ahead([0, 1], [3, 7])
    assert cuda.log == [("record", "main"), ("wait", "side", "main"), ("copy", "side", "out"),
                        ("copy", "side", "out"), ("record", "side")]  # behind the steps' rows, on the side stream
    assert shelf.copying
    cuda.log.clear()
    shelf.put([2], [5])  # another slot, another block: no wait
    shelf.get([0], [9])  # a slot the copies ahead write: after them
    shelf.put([1], [7])
    assert cuda.log == [("copy", "main", "out"), ("wait", "main", "side"), ("copy", "main", "in"),
                        ("copy", "main", "out")]  # (one wait: the current stream is behind them since)
    shelf.put_ahead([4], [8])
    shelf.put_ahead([5], [2])
    assert shelf.copying and len(shelf.in_flight) == 2
    shelf.in_flight[0][0].done = True  # the first landed: let go, the second still on its way
    assert shelf.copying and len(shelf.in_flight) == 1
    cuda.events[-1].done = True  # landed: nothing to wait for
    cuda.log.clear()
    shelf.put([4], [8])
    assert cuda.log == [("copy", "main", "out")] and not shelf.copying and not shelf.in_flight
    for slot, block in ((0, 3), (1, 7), (2, 5), (4, 8), (5, 2)):
        assert (shelf.rows(slot)[0] == keys[:, block]).all()
    assert (keys[:, 9] == keys[:, 3]).all()


def test_an_eviction_of_blocks_copied_ahead_copies_nothing_and_waits_only_for_their_copies():
    from engine.kvcache.host_tier import HostTier

    keys = pool(7)
    shelf, cuda = gpu_shelf([keys], capacity=4)
    tier = HostTier(4, shelf)
    block = {i: SimpleNamespace(index=i, key=bytes([i]), tokens=(i,), parent=b"") for i in (2, 5, 6)}
    assert tier.store_ahead([block[2], block[6]]) == 2
    cuda.log.clear()
    tier.store([block[5]])  # a block not copied ahead, into a free slot: no wait
    assert cuda.log == [("copy", "main", "out")]
    cuda.log.clear()
    tier.store([block[2], block[6]])  # their entries are the copies ahead; the next writes wait for them
    assert cuda.log == [("wait", "main", "side")] and set(tier.entries) == {b"\x02", b"\x05", b"\x06"}
    for i in (2, 5, 6):
        assert (shelf.rows(tier.entries[bytes([i])].slot)[0] == keys[:, i]).all()
