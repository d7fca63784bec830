"""quant_blocks.cuh's decoders, the CUDA source itself compiled for the host (host_cuda.py): every block type's
values as the GPU's kernels expand them (`values<T>`: the unit's bytes and affine pair, one fused multiply-add a
value) against gguf's NumPy dequantization of the same random blocks, bit for bit."""
import ctypes

import numpy as np
import pytest

from engine.core.quantized import BLOCKS
from gguf import GGMLQuantizationType, quants
from tests.engine.kernels.host_cuda import compiler, host_library

HALVES = {  # where each block holds fp16 scales (set to sane values: random bytes would give infinities)
    "Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2), "Q8_0": (0,), "Q4_K": (0, 2), "Q5_K": (0, 2),
    "Q6_K": (208,), "IQ2_XXS": (0,), "IQ2_XS": (0,), "IQ2_S": (0,), "IQ3_XXS": (0,), "IQ3_S": (0,), "IQ4_NL": (0,),
    "IQ4_XS": (0,)}
EXPORTS = "\n".join(f'extern "C" void values_{k}(const u8* row, int units, float* out) {{\n'
                    f"    for (int s = 0; s < units; ++s) values<{k}>(row, s, out + 32 * s);\n}}" for k in BLOCKS)


@pytest.fixture(scope="module")
def decoders(tmp_path_factory):
    assert compiler() is not None, "a C++ compiler (g++) is needed to run the decoders on the CPU"
    return host_library("quant_blocks.cuh", tmp_path_factory.mktemp("quant_blocks"), extra=EXPORTS)


def random_blocks(kind: str, blocks: int, seed: int, scale: float = 0.05) -> np.ndarray:
    """`blocks` random blocks of `kind` in one row, their fp16 scales in [-scale, scale]."""
    size, nbytes = BLOCKS[kind]
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, (blocks, nbytes), dtype=np.uint8)
    for at in HALVES[kind]:
        raw[:, at : at + 2] = (rng.uniform(-scale, scale, blocks).astype(np.float16).view(np.uint8).reshape(blocks, 2))
    return raw.reshape(1, -1)


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
