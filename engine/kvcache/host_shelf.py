"""Slots of host memory that hold whole pool blocks: where the prefix cache's host tier
(engine/kvcache/host_tier.py) keeps the rows of the blocks the pool evicts.

A pool array is (layers, blocks, *row) (engine/kvcache/kv.py; a q8_0 pool is two such arrays, the int8
values and the scales). The shelf keeps, for each pool array, chunks of CHUNK_SLOTS slots laid out the
same way, (layers, slots, *row), made when first used. Moving a run of consecutive blocks into a run of
consecutive slots is then one strided copy: `layers` pieces of run x row bytes, a pitch apart on each side.

On a GPU the chunks are page-locked and the copies are queued on the current stream without waiting: a
thousand evicted blocks (8 GiB of the 8B model's rows) leave at the link's rate in one pass of the copy
engine, behind the step that released them and ahead of the step that writes over them, where a copy a
block to pageable memory, each waited for, held the engine ~3 s (bench/HISTORY.md, nineteenth session).
Stream order keeps every byte right: a block's rows are copied out before the kernels that write its new
rows, and a slot's rows are copied back before a later eviction writes over the slot. `rows` (tests,
checks) waits for the copies first.

Page-locking is itself slow (~0.34 s a GiB on the H100's host): a chunk made when an eviction first needed it
held the engine ~165 ms for every 64 slots, 2.8 s in all when 64 clients' admission first overflowed a full pool
(bench/HISTORY.md, twenty-first session). On a GPU the runner therefore has the chunks made ahead
(`make_ahead`), in a thread of their own from the start, in the order the tier takes slots (0 first); a chunk
needed before the thread reached it is waited for, one the thread never made (it failed) is made on the spot.

Copies ahead (`put_ahead`: the rows of cached blocks the pool will evict next, engine/kvcache/host_tier.py
store_ahead) go on a stream of the shelf's own, behind what the current stream had queued (their rows are final
there), so that the copy engine moves them while the steps run: queued on the steps' stream, 576 blocks evicted by
64 clients' admission held the engine ~90 ms ahead of their reads (bench/HISTORY.md, twenty-second session). A batch
of them still on its way is waited for by the current stream only where it must be (`fence`): before a copy into
or out of one of its slots (put, get) and before one of its blocks, evicted, is written over (the tier's store).
Batches land in order, so waiting for the latest such batch waits for those before it; one that has landed costs
nothing. (The decode graphs' stream starts each step after the current stream's work: engine/runner/decode_graph.py.)
"""
from __future__ import annotations

import sys
import threading
from typing import Sequence

import numpy as np

CHUNK_SLOTS = 64  # slots a chunk of host memory holds (512 MiB of the 8B model's f16 rows)
MAX_PITCH = 2**31 - 1  # the widest pitch a strided copy takes (cudaDevAttrMaxPitch); past it, a copy a layer


def runs(blocks: Sequence[int], slots: Sequence[int], chunk: int) -> list[tuple[int, int, int]]:
    """(first block, first slot, length) of the runs where both blocks and slots go up by one, a run
    never crossing a chunk of slots."""
    out: list[tuple[int, int, int]] = []
    for block, slot in zip(blocks, slots):
        if out:
            b, s, n = out[-1]
            if block == b + n and slot == s + n and slot % chunk:
                out[-1] = (b, s, n + 1)
                continue
        out.append((block, slot, 1))
    return out


class HostShelf:
    def __init__(self, pools: Sequence, capacity: int, xp=np, chunk: int = CHUNK_SLOTS):
        """pools: the pool's arrays, each (layers, blocks, *row), contiguous; capacity: slots (blocks) it holds."""
        self.pools, self.capacity, self.xp, self.chunk = list(pools), capacity, xp, chunk
        self.chunks: dict[int, list[np.ndarray]] = {}  # chunk number -> per pool array (layers, chunk, *row)
        self.made = threading.Condition()  # guards `chunks` while a maker thread adds to them
        self.maker: threading.Thread | None = None
        self.maker_done = False  # the maker thread has ended (every chunk made, or it failed)
        self.side = None  # (GPU) the copies ahead's stream, made when first used
        self.in_flight: list[tuple[object, set[int], set[int]]] = []  # (GPU) batches of copies ahead the current
        # stream has not waited for, oldest first: (the event after it, its slots, its blocks)
        self.copies_beside_steps = self.on_gpu  # copies ahead run beside the steps (the copy engine), not in their time

    def make_ahead(self) -> None:
        """Make every chunk now, in a thread of its own (see the module's note), so that no eviction waits for
        memory to be page-locked."""
        if self.maker is None and self.capacity:
            device = self.xp.cuda.Device().id if self.on_gpu else None  # (a new thread's current device is 0)
            self.maker = threading.Thread(target=self._make_all, args=(device,), name="host-shelf", daemon=True)
            self.maker.start()

    def _make_all(self, device: int | None) -> None:
        try:
            if device is not None:
                self.xp.cuda.Device(device).use()
            for number in range(-(-self.capacity // self.chunk)):
                with self.made:
                    if number in self.chunks:
                        continue
                parts = self._make(number)  # (the slow part, with `chunks` free to read meanwhile)
                with self.made:
                    self.chunks.setdefault(number, parts)
                    self.made.notify_all()
        except Exception as e:  # a chunk not made here is made where it is first needed
            print(f"strata: the host tier's memory could not be made ahead ({type(e).__name__}: {e}); "
                  "the rest is made as it is first used", file=sys.stderr, flush=True)
        finally:
            with self.made:
                self.maker_done = True
                self.made.notify_all()

    @property
    def on_gpu(self) -> bool:
        return self.xp is not np

    @property
    def nbytes(self) -> int:
        """Host memory the shelf holds now (its chunks are made as slots are first used, or ahead)."""
        with self.made:
            return sum(part.nbytes for parts in self.chunks.values() for part in parts)

    @property
    def copying(self) -> bool:
        """Copies ahead still on their way."""
        return bool(self.on_their_way())

    def on_their_way(self) -> list[tuple[object, set[int], set[int]]]:
        """in_flight, the batches that have landed let go (none to wait for)."""
        self.in_flight = [batch for batch in self.in_flight if not batch[0].done]
        return self.in_flight

    def put(self, slots: Sequence[int], blocks: Sequence[int]) -> None:
        """The rows of these pool blocks into these slots, slots[i] <- blocks[i]."""
        self.fence(slots)
        self._put(slots, blocks)

    def put_ahead(self, slots: Sequence[int], blocks: Sequence[int]) -> None:
        """put, for blocks not yet evicted: on a GPU on the shelf's own stream, beside the steps (module's note)."""
        if not self.on_gpu:
            self._put(slots, blocks)
            return
        cuda = self.xp.cuda
        if self.side is None:
            self.side = cuda.Stream(non_blocking=True)
        self.side.wait_event(cuda.get_current_stream().record())  # the rows written, a slot's earlier copy back done
        with self.side:
            self._put(slots, blocks)
        self.in_flight.append((self.side.record(), set(slots), set(blocks)))

    def fence(self, slots: Sequence[int] = (), blocks: Sequence[int] = (), every: bool = False) -> None:
        """The current stream waits for the copies ahead still on their way that touch these slots or blocks (every:
        all of them), before it writes over what they read or write."""
        slots, blocks = set(slots), set(blocks)
        touched = [i for i, (_, s, b) in enumerate(self.on_their_way()) if every or s & slots or b & blocks]
        if touched:
            self.xp.cuda.get_current_stream().wait_event(self.in_flight[touched[-1]][0])
            del self.in_flight[: touched[-1] + 1]  # (the batches before it land first: the stream is behind them too)

    def _put(self, slots: Sequence[int], blocks: Sequence[int]) -> None:
        for block, slot, n in runs(blocks, slots, self.chunk):
            for pool, part in zip(self.pools, self._chunk(slot)):
                self._copy(part, slot % self.chunk, pool, block, n, to_host=True)

    def get(self, slots: Sequence[int], blocks: Sequence[int]) -> None:
        """These slots' rows into these pool blocks, blocks[i] <- slots[i]."""
        self.fence(slots)
        for block, slot, n in runs(blocks, slots, self.chunk):
            for pool, part in zip(self.pools, self._chunk(slot)):
                self._copy(pool, block, part, slot % self.chunk, n, to_host=False)

    def rows(self, slot: int) -> list[np.ndarray]:
        """One slot's rows, (layers, *row) per pool array (copies), once the queued copies are done."""
        if self.on_gpu:
            self.fence(every=True)
            self.xp.cuda.get_current_stream().synchronize()
        return [part[:, slot % self.chunk].copy() for part in self._chunk(slot)]

    def _chunk(self, slot: int) -> list[np.ndarray]:
        if not 0 <= slot < self.capacity:
            raise IndexError(f"slot {slot} of a shelf of {self.capacity}")
        number = slot // self.chunk
        with self.made:
            while number not in self.chunks and self.maker is not None and not self.maker_done:
                self.made.wait()  # the maker, going in order, gets to it
            if number not in self.chunks:
                self.chunks[number] = self._make(number)
            return self.chunks[number]

    def _make(self, number: int) -> list[np.ndarray]:
        return [self._host((pool.shape[0], self.chunk, *pool.shape[2:]), pool.dtype) for pool in self.pools]

    def _host(self, shape: tuple[int, ...], dtype) -> np.ndarray:
        if not self.on_gpu:
            return np.zeros(shape, dtype)
        dtype = np.dtype(dtype)
        size = int(np.prod(shape))
        memory = self.xp.cuda.alloc_pinned_memory(size * dtype.itemsize)
        return np.frombuffer(memory, dtype, size).reshape(shape)  # (keeps `memory` alive: its base)

    def _copy(self, dst, d0: int, src, s0: int, n: int, to_host: bool) -> None:
        """dst[:, d0:d0+n] = src[:, s0:s0+n], arrays (layers, count, *row): on a GPU one strided copy queued on
        the current stream (a copy a layer where a pitch is too wide for one)."""
        if not self.on_gpu:
            dst[:, d0 : d0 + n] = src[:, s0 : s0 + n]
            return
        row = int(np.prod(dst.shape[2:])) * dst.dtype.itemsize  # bytes of one block's rows in one layer
        dpitch, spitch, width = dst.shape[1] * row, src.shape[1] * row, n * row
        dptr, sptr = self._address(dst) + d0 * row, self._address(src) + s0 * row
        runtime, stream = self.xp.cuda.runtime, self.xp.cuda.get_current_stream().ptr
        kind = runtime.memcpyDeviceToHost if to_host else runtime.memcpyHostToDevice
        if max(dpitch, spitch) <= MAX_PITCH:
            runtime.memcpy2DAsync(dptr, dpitch, sptr, spitch, width, dst.shape[0], kind, stream)
            return
        for layer in range(dst.shape[0]):
            runtime.memcpyAsync(dptr + layer * dpitch, sptr + layer * spitch, width, kind, stream)

    def _address(self, array) -> int:
        return array.ctypes.data if isinstance(array, np.ndarray) else array.data.ptr
