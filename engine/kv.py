"""The KV cache: one set of rows per slot (a request in the engine), and copies of a slot's rows
for parked reads that had to give their slot up (spilled to host memory)."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from engine.backend import Backend
from engine.gguf_model import ModelConfig


@dataclass
class KVSnapshot:
    pos: int
    k: object  # (layers, kv_heads, pos, head_dim), a private copy (host memory)
    v: object  # (layers, kv_heads, pos, head_dim)

    @property
    def nbytes(self) -> int:
        return int(self.k.nbytes + self.v.nbytes)


@dataclass(frozen=True)
class LayerRows:
    """What the forward pass indexes by layer: k[i], v[i] are layer i's rows, (kv_heads, ctx, d)
    for one slot, or (slots, kv_heads, ctx, d) across slots (a decode batch: each row of the batch
    names its slot in the Step)."""

    k: object
    v: object


def kv_row_bytes(cfg: ModelConfig, backend: Backend) -> int:
    """Bytes of K and V for one position over all layers."""
    return 2 * cfg.n_layers * cfg.n_kv_heads * cfg.head_dim * np.dtype(backend.weight_dtype).itemsize


class KVCache:
    def __init__(self, cfg: ModelConfig, ctx: int, backend: Backend, slots: int = 1):
        shape = (slots, cfg.n_layers, cfg.n_kv_heads, ctx, cfg.head_dim)
        self.backend, self.ctx, self.slots = backend, ctx, slots
        # (slots, layers, kv_heads, ctx, head_dim): float32 on the CPU, float16 on the GPU
        self.keys = backend.xp.zeros(shape, dtype=backend.weight_dtype)
        self.values = backend.xp.zeros(shape, dtype=backend.weight_dtype)
        self.row_bytes = kv_row_bytes(cfg, backend)

    @property
    def k(self):
        """Slot 0's rows (layers, kv_heads, ctx, d): a one-slot cache indexed as the forward pass does."""
        return self.keys[0]

    @property
    def v(self):
        return self.values[0]

    def slot(self, s: int) -> LayerRows:
        return LayerRows(self.keys[s], self.values[s])

    def across_slots(self) -> LayerRows:
        """Layer i -> (slots, kv_heads, ctx, d): a decode batch reads and writes each row's own slot."""
        return LayerRows(self.keys.swapaxes(0, 1), self.values.swapaxes(0, 1))

    @property
    def slot_stride(self) -> int:
        """Elements from one slot's rows to the next's (a kernel's per-sequence offset unit)."""
        return int(np.prod(self.keys.shape[1:]))

    def snapshot_nbytes(self, pos: int) -> int:
        return pos * self.row_bytes

    def snapshot(self, s: int, pos: int) -> KVSnapshot:
        """Slot s's rows [0, pos) copied to host memory."""
        layers, heads, _, d = self.keys.shape[1:]
        rows = lambda: np.empty((layers, heads, pos, d), self.keys.dtype)  # noqa: E731
        snap = KVSnapshot(pos, rows(), rows())
        self.backend.copy_rows(snap.k, self.keys[s], pos)
        self.backend.copy_rows(snap.v, self.values[s], pos)
        return snap

    def restore(self, s: int, snap: KVSnapshot) -> None:
        self.backend.copy_rows(self.keys[s], snap.k, snap.pos)
        self.backend.copy_rows(self.values[s], snap.v, snap.pos)

    def digest(self, s: int, pos: int) -> bytes:
        h = hashlib.blake2b(digest_size=16)
        for arr in (self.keys[s], self.values[s]):
            h.update(self.backend.to_host(arr[:, :, :pos]).tobytes())
        return h.digest()
