"""The kernels' Step (engine/core/step.py) on the device: a sequence's tokens, or a decode batch's
rows, with their positions and block tables as device arrays every layer of a forward reads."""
from __future__ import annotations

from types import ModuleType

import numpy as np

from engine.core.step import Step


class DeviceSteps:
    """Mixed into GpuKernels, which sets what these read: cp (CuPy)."""

    cp: ModuleType

    def step(self, n: int, start: int, table=None) -> Step:
        """The kernels' description of one sequence's n tokens at `start`, its rows through `table`
        (its block table); every layer of a forward reuses it (one small copy to the device per
        forward)."""
        table = np.asarray(table if table is not None else [0], dtype=np.int32)
        return self.device_step(n, start, table)

    def batch_step(self, tables, positions: tuple[int, ...], max_keys: int | None = None,
                   block: int | None = None) -> Step:
        """A decode batch: row i is the next token of the sequence whose block table is tables[i],
        at positions[i]. With max_keys (and the pool's block size), a graph's step whose rows are
        set in place (Step.set_rows) before each replay: each table gets max_keys / block entries."""
        cp, n = self.cp, len(tables)
        width = -(-max_keys // block) if max_keys is not None else max(len(t) for t in tables)
        step = Step(n, -1, tuple(tables), tuple(positions), q_start=cp.arange(n + 1, dtype=cp.int32),
                    pos0=cp.empty(n, dtype=cp.int32), table=cp.empty(n * width, dtype=cp.int32),
                    table_off=cp.arange(0, n * width, width, dtype=cp.int32), max_keys=max_keys)
        step.set_rows(tables, positions)
        return step

    def reads_step(self, spans: tuple[tuple[int, int], ...], tables) -> Step:
        """Prompt rows of several sequences (spans: each one's (start, n)), one after another: per
        sequence its first query row, first position and table (prompt attention's grid has a
        sequence a z), and per row its position and table (RoPE and the K/V write take each row as
        a decode batch's row)."""
        cp = self.cp
        counts = np.asarray([n for _, n in spans], dtype=np.int32)
        q_start = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
        offsets = np.concatenate([[0], np.cumsum([len(t) for t in tables])[:-1]]).astype(np.int32)
        positions = np.concatenate([np.arange(start, start + n) for start, n in spans]).astype(np.int32)
        step = Step(int(q_start[-1]), spans[0][0], tuple(tables), spans=tuple(spans), q_start=cp.asarray(q_start),
                    pos0=cp.asarray(np.asarray([start for start, _ in spans], dtype=np.int32)),
                    table=cp.asarray(np.concatenate([np.asarray(t, dtype=np.int32) for t in tables])),
                    table_off=cp.asarray(offsets))
        step.row_pos0, step.row_table_off = cp.asarray(positions), cp.asarray(np.repeat(offsets, counts))
        return step

    def device_step(self, n: int, start: int, table: np.ndarray, max_keys: int | None = None) -> Step:
        cp = self.cp
        return Step(n, start, (table,), q_start=cp.asarray(np.array([0, n], dtype=np.int32)),
                    pos0=cp.asarray(np.array([start], dtype=np.int32)), table=cp.asarray(table),
                    table_off=cp.zeros(1, dtype=cp.int32), max_keys=max_keys)
