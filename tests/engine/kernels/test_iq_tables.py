"""engine/kernels/iq_tables.cuh is what engine/kernels/iq_tables.py renders from the gguf package's tables (the
header is generated, never edited), and its grids hold gguf's magnitudes, value j of an entry in byte j."""
import re

import numpy as np
from gguf import quants

from engine.kernels import KERNEL_DIR
from engine.kernels.iq_tables import GRIDS, render


def test_the_committed_header_is_the_rendered_one():
    assert (KERNEL_DIR / "iq_tables.cuh").read_text() == render(), \
        "regenerate: python -m engine.kernels.iq_tables > engine/kernels/iq_tables.cuh"


def test_each_grid_entry_unpacks_to_ggufs_values():
    text = render()
    for kind, name in GRIDS:
        body = re.search(rf"{name}\[\d+\] = \{{(.*?)\}};", text, re.S).group(1)
        words = [int(w.rstrip("ul"), 16) for w in re.findall(r"0x[0-9a-f]+u?l*", body)]
        cls = getattr(quants, kind)
        cls.init_grid()
        grid = cls.grid.reshape(-1, cls.grid_shape[-1])
        width = grid.shape[1]
        unpacked = np.array([[(w >> (8 * j)) & 0xFF for j in range(width)] for w in words], dtype=np.float32)
        np.testing.assert_array_equal(unpacked, grid)
    levels = [int(m, 16) for m in re.findall(r"IQ4_BYTES\d = (0x[0-9a-f]+)u", text)]
    unpacked = [((levels[i // 4] >> (8 * (i % 4))) & 0xFF) - 128 for i in range(16)]
    assert unpacked == list(quants.IQ4_NL.kvalues)
