"""quant.cu's weight kernels, the CUDA source itself run on the host (host_cuda.py: each block's warps as fibers
that meet at their shuffles), through their launchers: for every block type (the IQ types among them) the dp4a
matvecs (engine/kernels/matvec_launch.py) with the rows of x in 8 bits (quantize_q8) against gguf's values of the
weights, each row of a batch the bits of that row alone (the batch-invariance every decode step relies on); and
the expansion and embedding kernels (engine/kernels/dequant_launch.py) giving gguf's values."""
import numpy as np
import pytest

from engine.core.quantized import BLOCKS, QuantMatrix, QuantPart, quantize_q8
from engine.kernels.dequant_launch import DequantLaunchers
from engine.kernels.matvec_launch import MatvecLaunchers
from gguf import GGMLQuantizationType, quants
from tests.engine.kernels.host_cuda import HostKernels, compiler
from tests.engine.kernels.test_quant_blocks_host import random_blocks

ROWS, COLS = 24, 512
BATCHES = (1, 3, 8)  # rows of x a launch takes: quant.cu's part 2i holds kind i's kernels of 1..8 rows


class Launchers(MatvecLaunchers, DequantLaunchers):
    """GpuKernels' weight launchers, over NumPy and the host's kernels."""


def launchers(kind: str, workdir) -> Launchers:
    part = 2 * list(BLOCKS).index(kind)  # engine/kernels/model_parts.py's KIND_PART
    names = ("quantize_q8", f"dequant_{kind}", f"embed_{kind}", *(f"matvec_{kind}_n{nb}_f32" for nb in BATCHES))
    m = Launchers()
    m.cp, m.fn = np, HostKernels("quant.cu", workdir, names, defines=("PARTS=30", f"PART={part}"))
    m.stage, m.pairs, m.mmq_from, m.sms = False, False, 1 << 30, 1
    return m


@pytest.mark.parametrize("kind", sorted(BLOCKS))
def test_each_type_s_matvec_is_its_values_times_x_in_8_bits_and_each_row_its_own(kind, tmp_path):
    assert compiler() is not None, "a C++ compiler (g++) is needed to run the kernels on the CPU"
    size, nbytes = BLOCKS[kind]
    raw = random_blocks(kind, ROWS * COLS // size, seed=7).reshape(ROWS, -1)
    w = QuantMatrix((QuantPart(kind, raw, ROWS),), COLS)
    x = (np.random.default_rng(3).standard_normal((8, COLS)) * 0.5).astype(np.float16)
    m = launchers(kind, tmp_path)
    y8 = m.matvec(w, x, np.float32)  # (8, ROWS)
    values = quants.dequantize(raw, GGMLQuantizationType[kind]).reshape(ROWS, COLS)
    want = np.stack([quantize_q8(row) for row in x]) @ values.T.astype(np.float64)
    np.testing.assert_allclose(y8, want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max()))
    assert np.array_equal(m.matvec(w, x[2:5], np.float32), y8[2:5])
    assert np.array_equal(m.matvec(w, x[4], np.float32), y8[4])
    assert np.array_equal(m.dequantize(raw, kind, (ROWS, COLS)), values.astype(np.float16))
    assert np.array_equal(m.embed(w, np.array([5, 0, 23, 5])), values[[5, 0, 23, 5]])
