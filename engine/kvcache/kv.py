"""The KV cache: one pool of fixed-size blocks shared by every request (engine/kvcache/block_pool.py decides
who holds which), and copies of a request's rows in host memory (a parked read or a paused
decode moved out of the pool under memory pressure).

Layout, per layer: (blocks, kv_heads, block_size, head_dim), so that a block holds a run of
positions of each K/V head contiguously (a kernel's tile of keys is a few whole rows). A request's
block table maps its position p to block table[p // block_size], row p % block_size.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from engine.ops.backend import Backend
from engine.kvcache.host_shelf import HostShelf
from engine.modelfile.model_config import ModelConfig
from engine.core.kv_types import Q8Array, resolve

DEFAULT_BLOCK = 64  # positions per block (engine/cli.py --kv-block; bench/HISTORY.md says why)


@dataclass
class KVSnapshot:
    pos: int
    k: object  # (layers, blocks, kv_heads, block_size, head_dim), a private copy in host memory (a Q8Array for q8_0)
    v: object

    @property
    def nbytes(self) -> int:
        return int(self.k.nbytes + self.v.nbytes)


@dataclass(frozen=True)
class SequenceRows:
    """What the forward pass indexes by layer: k[i], v[i] are layer i's pool (blocks, kv_heads,
    block_size, d); `tables` are the block tables of the sequences of the forward (one for a
    prompt chunk, one per row for a decode batch); a hybrid model's `states` are theirs too, in the
    same order (engine/kvcache/recurrent.py)."""

    k: object  # (attention layers, blocks, kv_heads, block_size, d)
    v: object
    tables: tuple[np.ndarray, ...]  # each (blocks of that sequence,) int32
    states: tuple = ()  # each sequence's SequenceState (a hybrid model's), or none


def kv_row_bytes(cfg: ModelConfig, backend: Backend, kv_type: str = "auto") -> int:
    """Bytes of K and V for one position over all layers."""
    return round(2 * cfg.kv_layers * cfg.n_kv_heads * cfg.head_dim * resolve(kv_type, backend.weight_dtype).value_bytes)


class KVCache:
    """The pool. KVCache(cfg, ctx, backend) alone makes a pool for one sequence of ctx positions
    (tools and tests drive the model with one sequence: `kv` then stands for its rows)."""

    def __init__(self, cfg: ModelConfig, ctx: int, backend: Backend, block_size: int = DEFAULT_BLOCK,
                 blocks: int | None = None, kv_type: str = "auto", spare: int = 0):
        """blocks: those requests may hold (None: one sequence's ctx); spare: that many more past them,
        no request's (a decode graph's padding rows write there: engine/runner/decode_graph.py)."""
        self.backend, self.block_size = backend, block_size
        self.type = resolve(kv_type, backend.weight_dtype)  # engine/core/kv_types.py
        self.usable = blocks if blocks is not None else -(-ctx // block_size)
        self.blocks = self.usable + spare
        self.ctx = ctx  # the most positions one sequence may hold
        shape = (cfg.kv_layers, self.blocks, cfg.n_kv_heads, block_size, cfg.head_dim)
        # zeros: on the CPU pages are touched only when written
        self.keys, self.values = self.type.zeros(shape, backend.xp), self.type.zeros(shape, backend.xp)
        self.row_bytes = kv_row_bytes(cfg, backend, kv_type)
        self.block_bytes = self.row_bytes * block_size
        self.whole = np.arange(min(self.usable, self.blocks_for(ctx)), dtype=np.int32)  # the lone sequence's table

    def rows(self, *tables, states: tuple = ()) -> SequenceRows:
        """The rows of the sequences with these block tables (lists or arrays of block indices), and
        their recurrent states (a hybrid model's)."""
        return SequenceRows(self.keys, self.values, tuple(np.asarray(t, dtype=np.int32) for t in tables), tuple(states))

    def as_rows(self) -> SequenceRows:
        return self.rows(self.whole)

    def blocks_for(self, positions: int) -> int:
        """Blocks that hold positions [0, positions)."""
        return -(-positions // self.block_size)

    def lone_table(self, positions: int) -> np.ndarray:
        """The lone sequence's table (tools' one-sequence pools) for its rows [0, positions)."""
        return self.whole[: self.blocks_for(positions)]

    def snapshot_nbytes(self, pos: int) -> int:
        return self.blocks_for(pos) * self.block_bytes

    def held(self, table, pos: int) -> np.ndarray:
        """The blocks of `table` that hold its rows [0, pos), as an index array."""
        return np.asarray(table[: self.blocks_for(pos)], dtype=np.int64)

    def shelf(self, capacity: int) -> HostShelf:
        """Host slots for `capacity` whole blocks of this pool (the prefix cache's host tier keeps evicted
        blocks there): the K and V arrays, a q8_0 pool's values and scales each."""
        parts = [part for pool in (self.keys, self.values)
                 for part in ((pool.q, pool.scale) if isinstance(pool, Q8Array) else (pool,))]
        return HostShelf(parts, capacity, self.backend.xp)

    def read_blocks(self, indices) -> tuple[np.ndarray, np.ndarray]:
        """Host copies of these blocks' K and V: (layers, len(indices), kv_heads, block_size, d) each,
        in the pool's own type (a Q8Array's parts for q8_0)."""
        held = np.asarray(indices, dtype=np.int64)
        return self._host(self.keys[:, held]), self._host(self.values[:, held])

    def write_blocks(self, indices, k: np.ndarray, v: np.ndarray) -> None:
        """Host arrays shaped as read_blocks' into these blocks."""
        held = self.backend.xp.asarray(np.asarray(indices, dtype=np.int64))
        self.keys[:, held] = self._device(k)
        self.values[:, held] = self._device(v)

    def _host(self, rows):
        return rows.map(self.backend.to_host) if isinstance(rows, Q8Array) else self.backend.to_host(rows)

    def _device(self, rows):
        return rows.map(self.backend.asarray) if isinstance(rows, Q8Array) else self.backend.asarray(rows)

    def snapshot(self, table, pos: int) -> KVSnapshot:
        """The blocks holding rows [0, pos) of the sequence with this table, copied to host memory."""
        return KVSnapshot(pos, *self.read_blocks(self.held(table, pos)))

    def restore(self, table, snap: KVSnapshot) -> None:
        """A snapshot's rows into the (new) blocks of `table`, which covers at least snap.pos rows."""
        self.write_blocks(table[: snap.k.shape[1]], snap.k, snap.v)

    def digest(self, table, pos: int) -> bytes:
        """A hash of one sequence's rows [0, pos) as stored (a q8_0 pool's bytes and scales), in
        position order (not of where its blocks are). Copied to the host a layer at a time, so a
        long request's fingerprint needs one layer's rows of host memory, not the whole cache's."""
        h = hashlib.blake2b(digest_size=16)
        held = self.held(table, pos)
        if not len(held):
            return h.digest()
        last = pos - (len(held) - 1) * self.block_size  # rows of the last block that are the sequence's
        for layer in range(self.keys.shape[0]):
            for pool in (self.keys, self.values):
                blocks = self._host(pool[layer, held])  # (blocks, kv_heads, block_size, d)
                for part in (blocks.q, blocks.scale) if isinstance(blocks, Q8Array) else (blocks,):
                    h.update(np.ascontiguousarray(part[:-1]).tobytes())
                    h.update(np.ascontiguousarray(part[-1, :, :last]).tobytes())
        return h.digest()
