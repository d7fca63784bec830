"""sbq.cu, issue 48's probe of the super-block integer order, its CUDA source run on the host (host_cuda.py; mma.sync
emulated as PTX lays out its fragments): x in Q8K (a float scale a super-block) bit for bit as its NumPy form, the
solo kernel within float32's rounding of gguf's weights times x's values, and each row of x the solo kernel's bits
in every n-tile kernel, whichever rows are beside it (in fp16 out, those bits rounded once)."""
import numpy as np
import pytest

from gguf import GGMLQuantizationType, quants
from tests.engine.kernels.host_cuda import HostKernels, compiler
from tests.engine.kernels.test_quant_blocks_host import random_blocks
from tools.device.sbq_check import Q8K_BYTES, q8k

M, K = 40, 1280  # 40 weight rows: two whole 16-row tiles and a partial one; 5 super-blocks: a partial round of 4
def values(blocks: np.ndarray) -> np.ndarray:
    """Q8K blocks (n, k / 256, 288) -> the values they stand for (n, k) float64."""
    q = blocks[..., :256].view(np.int8).astype(np.float64)
    d = blocks[..., 272:276].copy().view(np.float32).astype(np.float64)
    return (q * d).reshape(blocks.shape[0], -1)


@pytest.mark.parametrize("kind", ["Q4_K", "Q6_K"])
def test_super_block_sums_give_every_row_its_solo_bits_and_the_weights_values(kind, tmp_path):
    assert compiler() is not None, "a C++ compiler (g++) is needed to run the kernels on the CPU"
    raw = random_blocks(kind, M * K // 256, seed=19).reshape(M, -1)
    x = (np.random.default_rng(23).standard_normal((19, K)) * 0.5).astype(np.float16)
    x[3, :256] = 0  # a super-block of zeros: d = 0
    names = ("quantize_q8k", f"sbq_{kind}_n1_f32", f"sbq_{kind}_t4", *(f"sbq_{kind}_t{nt}_f32" for nt in (1, 2, 4, 8)))
    fn = HostKernels("sbq.cu", tmp_path, names)
    xq = np.zeros((19, K // 256, Q8K_BYTES), dtype=np.uint8)
    fn["quantize_q8k"](((19 * K // 256 * 32 + 127) // 128,), (128,), (x, xq, np.int32(19 * K // 256)))
    assert np.array_equal(xq, q8k(x))

    alone = np.full((19, M), np.nan, dtype=np.float32)
    for b in range(19):
        fn[f"sbq_{kind}_n1_f32"](((M + 3) // 4,), (128,), (raw, xq[b], alone[b], np.int32(M), np.int32(K)))
    w = quants.dequantize(raw, GGMLQuantizationType[kind]).reshape(M, K).astype(np.float64)
    want = values(xq) @ w.T
    np.testing.assert_allclose(alone, want, rtol=0, atol=2e-5 * float(np.abs(want).max()))

    for n, nt in ((1, 1), (5, 1), (13, 2), (19, 4), (9, 8), (19, 8)):
        got = np.full((n, M), np.nan, dtype=np.float32)
        fn[f"sbq_{kind}_t{nt}_f32"](((M + 63) // 64,), (128,),
                                    (raw, xq[:n], got, np.int32(M), np.int32(K), np.int32(M), np.int32(n)))
        assert np.array_equal(got, alone[:n]), (n, nt)
    got = np.full((16, M), np.nan, dtype=np.float32)  # the same rows at other places of the tiles
    fn[f"sbq_{kind}_t2_f32"](((M + 63) // 64,), (128,),
                             (raw, xq[3:19], got, np.int32(M), np.int32(K), np.int32(M), np.int32(16)))
    assert np.array_equal(got, alone[3:19])
    half = np.full((19, M), np.nan, dtype=np.float16)  # fp16 out: the same sums, rounded once
    fn[f"sbq_{kind}_t4"](((M + 63) // 64,), (128,),
                         (raw, xq, half, np.int32(M), np.int32(K), np.int32(M), np.int32(19)))
    assert np.array_equal(half, alone.astype(np.float16))
