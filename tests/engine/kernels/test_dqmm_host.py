"""dqmm.cu's quantized weights decoded to fp16 against rows of x on the fp16 tensor cores, the CUDA source run on
the host (host_cuda.py; mma.sync emulated as PTX lays out its fragments, cuda_host.h): the products are the
weights' values (gguf's) times x in fp16 within fp16's rounding of the weights, and each row of x gets the same
bits whichever batch (and n-tile kernel) it is in, the one property the kernel exists to keep."""
import numpy as np
import pytest

from gguf import GGMLQuantizationType, quants
from tests.engine.kernels.host_cuda import HostKernels, compiler
from tests.engine.kernels.test_quant_blocks_host import random_blocks

M, K = 40, 512  # 40 weight rows: 64-row blocks at 4 n-tiles (a group past the matrix), partial tiles; 16 units a
# row: 4 a warp (2 with 8 warps)
KINDS = ("Q4_K", "Q6_K", "Q8_0")


def run(fn, raw, x, m, k, nt, warps=4):
    """y (n, m) float32 by dqmm_<kind>_t<nt>_f32 over the rows of x (DQ_WIDE_G = DQ_WIDE_R = 2 from 4 n-tiles)."""
    n, g = x.shape[0], 2 if nt >= 4 else 1
    y = np.full((n, m), np.nan, dtype=np.float32)
    fn((-(-m // (16 * g * g)),), (warps * 32 * g,),
       (raw, np.ascontiguousarray(x), y, np.int32(m), np.int32(k), np.int32(m), np.int32(n)))
    return y


@pytest.mark.parametrize("kind, warps", [(kind, 4) for kind in KINDS] + [("Q4_K", 8)])
def test_each_row_of_x_has_its_own_bits_in_any_batch_and_the_weights_values(kind, warps, tmp_path):
    assert compiler() is not None, "a C++ compiler (g++) is needed to run the kernels on the CPU"
    size, _ = {"Q4_K": (256, 144), "Q6_K": (256, 210), "Q8_0": (32, 34)}[kind]
    raw = random_blocks(kind, M * K // size, seed=13).reshape(M, -1)
    x = (np.random.default_rng(17).standard_normal((19, K)) * 0.5).astype(np.float16)
    fn = HostKernels("dqmm.cu", tmp_path, tuple(f"dqmm_{kind}_t{nt}_f32" for nt in (1, 2, 4, 8)),
                     defines=("DQ_WIDE_G=2", "DQ_WIDE_R=2", f"DQ_WARPS={warps}"))
    alone = np.concatenate([run(fn[f"dqmm_{kind}_t1_f32"], raw, x[b:b + 1], M, K, 1, warps) for b in range(19)])
    values = quants.dequantize(raw, GGMLQuantizationType[kind]).reshape(M, K).astype(np.float64)
    want = x.astype(np.float64) @ values.T
    scale = float(np.abs(want).max())
    np.testing.assert_allclose(alone, want, rtol=0, atol=2e-3 * scale)  # the weights in fp16: ~2^-11 each
    for n, nt in ((5, 1), (13, 2), (19, 4), (9, 8), (19, 8)):
        got = run(fn[f"dqmm_{kind}_t{nt}_f32"], raw, x[:n], M, K, nt, warps)
        assert np.array_equal(got, alone[:n]), (kind, n, nt)
    shifted = run(fn[f"dqmm_{kind}_t4_f32"], raw, x[3:19], M, K, 4, warps)  # the same rows at other places
    assert np.array_equal(shifted, alone[3:19])
