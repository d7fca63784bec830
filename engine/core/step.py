"""Where one forward's tokens sit (Step): the metadata the runner sets and every layer's kernels read,
the bottom layer that the backend, the kernels and the decode graphs share."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class Step:
    """Where one forward's tokens sit: either n tokens of one sequence at positions start..start+n
    (a prompt chunk, or a lone decode row), or prompt rows of several sequences one after another
    (spans: each one's (start, n), a shape-free backend's reads sharing a step), or a decode batch of
    n sequences with one token each, row i at positions[i]. Each sequence's K/V rows are reached through its block table (engine/kvcache/kv.py:
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
    spans: tuple[tuple[int, int], ...] | None = None  # prompt rows of sequences: each one's (start, n)
    row_pos0: object = None  # (n,) int32 with spans, on the GPU: each row's position
    row_table_off: object = None  # (n,) int32 with spans, on the GPU: where each row's table starts in `table`
    states: object = None  # a hybrid's decode graph: its rows' recurrent states by address (StatePointers in
    # engine/kernels/linear_attention_launch.py), at fixed places, set before each replay

    @property
    def batch(self) -> bool:
        return self.positions is not None

    @property
    def decode(self) -> bool:
        """One token per sequence: the memory-bound path (matvecs, flash-decoding). Prompt rows given
        as spans are prompt rows, one or many."""
        return self.batch or (self.n == 1 and self.spans is None)

    def spans_or_one(self) -> tuple[tuple[int, int], ...]:
        """Each sequence's (start, n) of a prompt step."""
        return self.spans if self.spans is not None else ((self.start, self.n),)

    def row_ranges(self) -> list[tuple[int, int]]:
        """Each sequence's rows [lo, hi) of a prompt step."""
        out, lo = [], 0
        for _, n in self.spans_or_one():
            out.append((lo, lo + n))
            lo += n
        return out

    def row_positions(self) -> np.ndarray:
        """(n,) each row's position."""
        if self.batch:
            return np.asarray(self.positions)
        return np.concatenate([np.arange(start, start + n) for start, n in self.spans_or_one()])

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
