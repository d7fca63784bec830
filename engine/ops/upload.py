"""Host rows to the GPU through pinned staging buffers: the weights' upload at start.

A plain `cupy.asarray` of a NumPy array copies from pageable memory, synchronously: the driver stages
it through its own small pinned buffer, ~2 GB/s on the H200's host, so a 4.6 GB model took 2.4-2.8 s
to upload on a start whose file was already in the page cache. Here the host copies (out of the
memory-mapped file, which also faults its pages in) run on a few threads into a ring of pinned
buffers, and each filled buffer is sent by an asynchronous copy on a stream of its own while the next
ones fill. The bytes are the same: only the path changes (tools/device/upload_check.py compares them
on the device).

CUDA is called from the calling thread only; the worker threads run NumPy copies (which release the
GIL). The caller's stream waits for the copies (an event), so whatever runs on it later sees the
weights; `close()` waits for everything and gives the pinned memory back."""
from __future__ import annotations

import os
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from types import ModuleType

import numpy as np

CHUNK_BYTES = 32 << 20  # one pinned buffer: big enough that a copy's fixed cost is small against its bytes
SMALL_BYTES = 1 << 20  # arrays below this go straight through cupy.asarray (norm vectors, biases)


@dataclass(frozen=True)
class Chunk:
    """Rows lo..hi-1 of piece `piece`, bound for the device array at byte `offset`."""

    piece: int
    lo: int
    hi: int
    offset: int


def chunk_rows(rows: list[int], row_bytes: int, chunk_bytes: int = CHUNK_BYTES) -> list[Chunk]:
    """Pieces of rows[i] rows of row_bytes each, stacked one under the other, cut into chunks of whole
    rows of at most chunk_bytes (a row larger than that is a chunk alone)."""
    per_chunk = max(1, chunk_bytes // max(1, row_bytes))
    chunks, offset = [], 0
    for i, n in enumerate(rows):
        for lo in range(0, n, per_chunk):
            hi = min(n, lo + per_chunk)
            chunks.append(Chunk(i, lo, hi, offset))
            offset += (hi - lo) * row_bytes
    return chunks


class Slot:
    """One pinned staging buffer and the event of the last copy that read it."""

    def __init__(self, cp: ModuleType, nbytes: int):
        self.memory = cp.cuda.alloc_pinned_memory(nbytes)
        self.host = np.frombuffer(self.memory, np.uint8, nbytes)  # (nbytes,) the buffer seen by NumPy
        self.sent = cp.cuda.Event(block=False, disable_timing=True)


class PinnedUpload:
    """upload(pieces) -> one device array, the pieces' rows stacked (axis 0). Buffers and threads are
    made on first use and kept until close()."""

    def __init__(self, cp: ModuleType, chunk_bytes: int = CHUNK_BYTES, threads: int | None = None):
        self.cp, self.chunk_bytes = cp, chunk_bytes
        self.threads = threads or max(1, min(4, os.cpu_count() or 1))
        self.slots: list[Slot] = []
        self.pool: ThreadPoolExecutor | None = None
        self.stream = None
        self.used = 0  # chunks sent so far: chunk k goes through slot k % len(slots)

    def __call__(self, pieces: list[np.ndarray]):
        """pieces: arrays of one dtype and trailing shape, (rows_i, ...) -> device (sum rows_i, ...)."""
        cp, first = self.cp, pieces[0]
        shape = (sum(int(p.shape[0]) for p in pieces),) + first.shape[1:]
        nbytes = int(np.prod(shape)) * first.itemsize
        row_bytes = nbytes // max(1, shape[0])
        if nbytes < SMALL_BYTES or row_bytes > self.chunk_bytes:
            return cp.asarray(first if len(pieces) == 1 else np.concatenate(pieces))
        out = cp.empty(shape, first.dtype)
        self.start()
        self.stream.wait_event(cp.cuda.get_current_stream().record())  # `out`'s memory is free there too
        pending: deque[tuple[Future, Slot, Chunk]] = deque()
        for c in chunk_rows([int(p.shape[0]) for p in pieces], row_bytes, self.chunk_bytes):
            if len(pending) == self.threads:
                self.send(*pending.popleft(), out, row_bytes)
            slot = self.slots[self.used % len(self.slots)]
            self.used += 1
            slot.sent.synchronize()  # the copy that last read this buffer is done
            pending.append((self.pool.submit(fill, slot.host, pieces[c.piece][c.lo:c.hi]), slot, c))
        while pending:
            self.send(*pending.popleft(), out, row_bytes)
        done = cp.cuda.Event(block=False, disable_timing=True)
        done.record(self.stream)
        cp.cuda.get_current_stream().wait_event(done)  # work queued later on the caller's stream sees `out`
        return out

    def start(self) -> None:
        if self.pool is None:
            cp = self.cp
            self.stream = cp.cuda.Stream(non_blocking=True)
            self.slots = [Slot(cp, self.chunk_bytes) for _ in range(2 * self.threads)]  # a round filling, one sending
            self.pool = ThreadPoolExecutor(self.threads, thread_name_prefix="upload")

    def send(self, filled: Future, slot: Slot, c: Chunk, out, row_bytes: int) -> None:
        """The chunk's bytes, once on the slot's buffer, copied to their place in `out`."""
        nbytes = filled.result()
        self.cp.cuda.runtime.memcpyAsync(out.data.ptr + c.offset, slot.memory.ptr, nbytes,
                                         self.cp.cuda.runtime.memcpyHostToDevice, self.stream.ptr)
        slot.sent.record(self.stream)

    def close(self) -> None:
        """Every copy finished; the threads stopped and the pinned buffers freed."""
        if self.pool is None:
            return
        self.stream.synchronize()
        self.pool.shutdown()
        self.pool, self.slots, self.stream = None, [], None
        self.cp.get_default_pinned_memory_pool().free_all_blocks()


def fill(buffer: np.ndarray, rows: np.ndarray) -> int:
    """rows (any strides) copied into the start of buffer as C-ordered bytes; their byte count."""
    view = buffer[:rows.nbytes].view(rows.dtype).reshape(rows.shape)
    np.copyto(view, rows)
    return rows.nbytes
