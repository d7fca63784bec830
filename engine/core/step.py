"""Where one forward's tokens sit (Step): the metadata the runner sets and every layer's kernels read,
the bottom layer that the backend, the kernels and the decode graphs share."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class Step:
    """Where one forward's tokens sit: either n tokens of one sequence at positions start..start+n
    (a prompt chunk, or a lone decode row), or a decode batch of n sequences with one token each,
    row i at positions[i]. Each sequence's K/V rows are reached through its block table (engine/kvcache/kv.py:
    position p is row p % block_size of block table[p // block_size]). On the GPU it also holds the
    device arrays the kernels read, so that a captured decode graph reads each step's positions and
    tables from memory; max_keys bounds a decode kernel's grid (a graph's bucket)."""

    n: int
    start: int
    tables: tuple[np.ndarray, ...] = ()  # each sequence's block table (host), in row order
    positions: tuple[int, ...] | None = None  # a decode batch: each row's position
    q_start: object = None  # (sequences + 1,) int32: each sequence's first query row
    pos0: object = None  # (sequences,) int32: each sequence's first position
    table: object = None  # (sequences * table_width,) int32: the block tables, one after another
    table_off: object = None  # (sequences,) int32: where each sequence's table starts in `table`
    max_keys: int | None = None
    held: tuple | None = None  # a prompt step over a q8_0 pool: its widened blocks' tables (GpuKernels.widened_tables)

    @property
    def batch(self) -> bool:
        return self.positions is not None

    @property
    def decode(self) -> bool:
        """One token per sequence: the memory-bound path (matvecs, flash-decoding)."""
        return self.batch or self.n == 1

    def set_position(self, pos: int) -> None:
        """A graph's step: the position its next replay reads."""
        self.pos0.set(np.array([pos], dtype=np.int32))

    def set_rows(self, tables, positions) -> None:
        """A decode batch's step: row i's position and block table (each written into its fixed
        stretch of the device table, table_off[i] onwards)."""
        self.tables, self.positions = tuple(tables), tuple(positions)
        self.pos0.set(np.asarray(positions, dtype=np.int32))
        self.table.set(pack_tables(self.tables, self.table.size // len(self.tables)))


def pack_tables(tables, width: int) -> np.ndarray:
    """Block tables one after another, each padded to `width` entries: (len(tables) * width,) int32."""
    out = np.zeros((len(tables), width), dtype=np.int32)
    for i, t in enumerate(tables):
        if len(t) > width:
            raise ValueError(f"a block table of {len(t)} blocks exceeds the step's {width}")
        out[i, : len(t)] = t
    return out.reshape(-1)
