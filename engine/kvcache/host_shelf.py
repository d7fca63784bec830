"""Slots of host memory that hold whole pool blocks: where the prefix cache's host tier
(engine/kvcache/host_tier.py) keeps the rows of the blocks the pool evicts.

A pool array is (layers, blocks, *row) (engine/kvcache/kv.py; a q8_0 pool is two such arrays, the int8
values and the scales). The shelf keeps, for each pool array, chunks of CHUNK_SLOTS slots laid out the
same way, (layers, slots, *row), made when first used. Moving a run of consecutive blocks into a run of
consecutive slots is then one strided copy: `layers` pieces of run x row bytes, a pitch apart on each side.

On a GPU the copies are CuPy's, a run at a time, each waited for: only an eviction's runs of consecutive
blocks gain on the earlier copy a block. Page-locked chunks and strided copies queued on the stream without
waiting (a thousand evicted blocks, 8 GiB of the 8B model's rows, at the link's rate, where the copies a block
to pageable memory held the engine 1.7-3.2 s: bench/HISTORY.md, nineteenth session) wait for their device
check: tools/device/pending/01-host-shelf-async-copies.patch.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

CHUNK_SLOTS = 64  # slots a chunk of host memory holds (512 MiB of the 8B model's f16 rows)


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

    @property
    def on_gpu(self) -> bool:
        return self.xp is not np

    @property
    def nbytes(self) -> int:
        """Host memory the shelf holds now (its chunks are made as slots are first used)."""
        return sum(part.nbytes for parts in self.chunks.values() for part in parts)

    def put(self, slots: Sequence[int], blocks: Sequence[int]) -> None:
        """The rows of these pool blocks into these slots, slots[i] <- blocks[i]."""
        for block, slot, n in runs(blocks, slots, self.chunk):
            for pool, part in zip(self.pools, self._chunk(slot)):
                self._copy(part, slot % self.chunk, pool, block, n, to_host=True)

    def get(self, slots: Sequence[int], blocks: Sequence[int]) -> None:
        """These slots' rows into these pool blocks, blocks[i] <- slots[i]."""
        for block, slot, n in runs(blocks, slots, self.chunk):
            for pool, part in zip(self.pools, self._chunk(slot)):
                self._copy(pool, block, part, slot % self.chunk, n, to_host=False)

    def rows(self, slot: int) -> list[np.ndarray]:
        """One slot's rows, (layers, *row) per pool array (copies), once the queued copies are done."""
        if self.on_gpu:
            self.xp.cuda.get_current_stream().synchronize()
        return [part[:, slot % self.chunk].copy() for part in self._chunk(slot)]

    def _chunk(self, slot: int) -> list[np.ndarray]:
        if not 0 <= slot < self.capacity:
            raise IndexError(f"slot {slot} of a shelf of {self.capacity}")
        number = slot // self.chunk
        if number not in self.chunks:
            self.chunks[number] = [self._host((pool.shape[0], self.chunk, *pool.shape[2:]), pool.dtype)
                                   for pool in self.pools]
        return self.chunks[number]

    def _host(self, shape: tuple[int, ...], dtype) -> np.ndarray:
        return np.zeros(shape, dtype)

    def _copy(self, dst, d0: int, src, s0: int, n: int, to_host: bool) -> None:
        """dst[:, d0:d0+n] = src[:, s0:s0+n], arrays (layers, count, *row), one on the host and one in the pool."""
        if not self.on_gpu:
            dst[:, d0 : d0 + n] = src[:, s0 : s0 + n]
        elif to_host:
            dst[:, d0 : d0 + n] = self.xp.asnumpy(src[:, s0 : s0 + n])
        else:
            dst[:, d0 : d0 + n] = self.xp.asarray(np.ascontiguousarray(src[:, s0 : s0 + n]))
