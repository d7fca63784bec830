"""quant_blocks.cuh's decoders, the CUDA source itself compiled for the host (host_cuda.py): every block type's
values as the GPU's kernels expand them (`values<T>`: the unit's bytes and affine pair, one fused multiply-add a
value) against gguf's NumPy dequantization of the same random blocks, bit for bit."""
import ctypes

import numpy as np
import pytest

from engine.core.quantized import BLOCKS
from gguf import GGMLQuantizationType, quants
from tests.engine.kernels.host_cuda import compiler, host_library
from tools.fixtures.make_synthetic_gguf import random_blocks as synthetic_blocks

EXPORTS = "\n".join(f'extern "C" void values_{k}(const u8* row, int units, float* out) {{\n'
                    f"    for (int s = 0; s < units; ++s) values<{k}>(row, s, out + 32 * s);\n}}" for k in BLOCKS)


@pytest.fixture(scope="module")
def decoders(tmp_path_factory):
    assert compiler() is not None, "a C++ compiler (g++) is needed to run the decoders on the CPU"
    return host_library("quant_blocks.cuh", tmp_path_factory.mktemp("quant_blocks"), extra=EXPORTS)


def random_blocks(kind: str, blocks: int, seed: int, std: float = 0.05) -> np.ndarray:
    """`blocks` random blocks of `kind` in one row, valid scales, values spread about `std` (the synthetic files'
    generator's)."""
    size, _ = BLOCKS[kind]
    return synthetic_blocks(np.random.default_rng(seed), GGMLQuantizationType[kind], 1, blocks * size, std)


@pytest.mark.parametrize("kind", sorted(BLOCKS))
def test_each_type_decodes_as_gguf_does(decoders, kind):
    size, _ = BLOCKS[kind]
    raw = random_blocks(kind, 24, seed=len(kind))
    units = 24 * size // 32
    got = np.empty(units * 32, dtype=np.float32)
    getattr(decoders, f"values_{kind}")(ctypes.c_void_p(raw.ctypes.data), ctypes.c_int(units),
                                        ctypes.c_void_p(got.ctypes.data))
    want = quants.dequantize(raw, GGMLQuantizationType[kind]).reshape(-1).astype(np.float32)
    assert np.isfinite(want).all() and want.std() > 0
    assert np.array_equal(got, want), f"{kind}: {int((got != want).sum())} of {got.size} values differ"
