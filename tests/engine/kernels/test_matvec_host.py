"""quant.cu's weight kernels, the CUDA source itself run on the host (host_cuda.py: each block's warps as fibers
that meet at their shuffles), through their launchers: for every block type (the IQ types among them) the dp4a
matvecs (engine/kernels/matvec_launch.py) with the rows of x in 8 bits (quantize_q8) against gguf's values of the
weights, each row of a batch the bits of that row alone (the batch-invariance every decode step relies on); and
the expansion and embedding kernels (engine/kernels/dequant_launch.py) giving gguf's values; and mmq.cu's
int8 tensor-core tiles (mma.sync emulated: cuda_host.h) giving every row the dp4a matvec's bits."""
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


TILE_KINDS = ("Q4_K", "Q6_K", *(k for k in BLOCKS if k.startswith("IQ")))  # the IQ types' tiles, and two that
# a GPU has checked (a k32 and a k16 one: they hold the mma emulation to PTX's fragment layouts)


@pytest.mark.parametrize("kind", TILE_KINDS)
def test_each_type_s_tensor_core_tiles_give_the_matvec_s_bits(kind, tmp_path):
    """mmq_<kind>_t<NT> for 8, 13 and 19 rows of x (one, two and three 8-row tiles; partial ones) against the
    matvec of each row alone, bit for bit, as on the GPU."""
    size, _ = BLOCKS[kind]
    raw = random_blocks(kind, 40 * 1024 // size, seed=11).reshape(40, -1)  # 40 rows: a partial 32-row tile
    w = QuantMatrix((QuantPart(kind, raw, 40),), 1024)  # 32 units a row: one slab
    x = (np.random.default_rng(5).standard_normal((19, 1024)) * 0.5).astype(np.float16)
    m = launchers(kind, tmp_path)
    alone = np.stack([m.matvec(w, row, np.float32) for row in x])  # (19, 40)
    part = list(BLOCKS).index(kind)  # mmq.cu's part of this kind
    m.fn.update(HostKernels("mmq.cu", tmp_path, tuple(f"mmq_{kind}_t{nt}_f32" for nt in (1, 2, 4)),
                            defines=("PARTS=15", f"PART={part}")))
    m.mmq_from, m.sms = 8, 3
    for n in (8, 13, 19):
        assert np.array_equal(m.matvec(w, x[:n], np.float32), alone[:n]), n


def test_rows_of_x_that_are_not_fp16_are_refused():
    """The kernels read x's bytes as halves: float32 rows are a TypeError, not numbers hundreds of nats off (prompt
    log-probabilities' rows, before their mend)."""
    m = Launchers()
    m.cp = np
    w = QuantMatrix((QuantPart("Q4_0", random_blocks("Q4_0", 2 * COLS // 32, seed=1).reshape(2, -1), 2),), COLS)
    with pytest.raises(TypeError, match="float16, not float32"):
        m.matvec(w, np.zeros((1, COLS), dtype=np.float32))
