"""The KV cache of the one running sequence, and snapshots of its rows for parked reads."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from engine.backend import Backend
from engine.gguf_model import ModelConfig


@dataclass
class KVSnapshot:
    pos: int
    k: object  # (layers, kv_heads, pos, head_dim), a private copy
    v: object  # (layers, kv_heads, pos, head_dim)

    @property
    def nbytes(self) -> int:
        return int(self.k.nbytes + self.v.nbytes)


def kv_row_bytes(cfg: ModelConfig, backend: Backend) -> int:
    """Bytes of K and V for one position over all layers."""
    return 2 * cfg.n_layers * cfg.n_kv_heads * cfg.head_dim * np.dtype(backend.weight_dtype).itemsize


class KVCache:
    def __init__(self, cfg: ModelConfig, ctx: int, backend: Backend):
        shape = (cfg.n_layers, cfg.n_kv_heads, ctx, cfg.head_dim)
        self.backend, self.ctx = backend, ctx
        # (layers, kv_heads, ctx, head_dim): float32 on the CPU, float16 on the GPU
        self.k = backend.xp.zeros(shape, dtype=backend.weight_dtype)
        self.v = backend.xp.zeros(shape, dtype=backend.weight_dtype)
        self.row_bytes = kv_row_bytes(cfg, backend)

    def snapshot_nbytes(self, pos: int) -> int:
        return pos * self.row_bytes

    def snapshot(self, pos: int) -> KVSnapshot:
        layers, heads, _, d = self.k.shape
        rows = lambda: self.backend.xp.empty((layers, heads, pos, d), self.k.dtype)  # noqa: E731
        snap = KVSnapshot(pos, rows(), rows())
        self.backend.copy_rows(snap.k, self.k, pos)
        self.backend.copy_rows(snap.v, self.v, pos)
        return snap

    def restore(self, snap: KVSnapshot) -> None:
        self.backend.copy_rows(self.k, snap.k, snap.pos)
        self.backend.copy_rows(self.v, snap.v, snap.pos)

    def digest(self, pos: int) -> bytes:
        h = hashlib.blake2b(digest_size=16)
        for arr in (self.k, self.v):
            h.update(self.backend.to_host(arr[:, :, :pos]).tobytes())
        return h.digest()
