"""The pinned upload's plan (engine/ops/upload.py): pieces cut into chunks of whole rows that cover every
byte once, in order. (The copies themselves run on the device: tools/device/upload_check.py.)"""
from __future__ import annotations

import numpy as np
import pytest

from engine.ops.upload import chunk_rows, fill


@pytest.mark.parametrize("rows,row_bytes,chunk", [([10], 7, 20), ([3, 0, 5], 4, 4), ([1], 100, 10), ([6, 6], 8, 48)])
def test_chunks_cover_every_row_once_in_order(rows, row_bytes, chunk):
    chunks = chunk_rows(rows, row_bytes, chunk)
    seen = [(c.piece, r) for c in chunks for r in range(c.lo, c.hi)]
    assert seen == [(i, r) for i, n in enumerate(rows) for r in range(n)]
    offsets = [c.offset for c in chunks]
    assert offsets == [sum((d.hi - d.lo) * row_bytes for d in chunks[:k]) for k in range(len(chunks))]
    assert all((c.hi - c.lo) * row_bytes <= max(chunk, row_bytes) for c in chunks)


def test_fill_writes_strided_rows_as_c_ordered_bytes():
    buffer = np.zeros(64, np.uint8)
    rows = np.arange(24, dtype=np.uint16).reshape(4, 6)[:, ::2]  # (4, 3), not contiguous
    assert fill(buffer, rows) == rows.nbytes
    assert buffer[:rows.nbytes].tobytes() == np.ascontiguousarray(rows).tobytes()
    assert not buffer[rows.nbytes:].any()
