"""attention.cu's prompt-chunk flash attention (mma.sync and ldmatrix emulated warp-wide: cuda_host.h), the CUDA
source itself run on the host through its launcher (engine/kernels/attention_launch.py), against the NumPy
attention of engine/ops/backend.py: the 256-wide heads' kernel (the hybrid families'), beside the 64- and 128-wide
ones a GPU has checked (they hold the emulation to PTX's fragment layouts). Chunks with a prefix, partial tiles,
grouped query heads, two sequences in one launch."""
import numpy as np
import pytest

from engine.core.step import Step
from engine.kernels.attention_launch import AttentionLaunchers, HEAD_DIMS
from engine.ops.backend import ArrayOps
from tests.engine.kernels.host_cuda import HostKernels, compiler

BLOCK = 64


@pytest.fixture(scope="module")
def kernels(tmp_path_factory):
    assert compiler() is not None, "a C++ compiler (g++) is needed to run the kernels on the CPU"
    launcher = AttentionLaunchers()
    launcher.cp, launcher.prompt_attention, launcher.fn = np, "mma", {}
    for i, d in enumerate(HEAD_DIMS):  # attention.cu's prompt kernel of each head width: part 9 i
        launcher.fn.update(HostKernels("attention.cu", tmp_path_factory.mktemp(f"attention_d{d}"),
                                       (f"flash_attention_d{d}",), defines=("PARTS=21", f"PART={9 * i}")))
    return launcher


@pytest.mark.parametrize("d, heads, kv_heads", [(64, 6, 2), (128, 8, 8), (256, 16, 2), (256, 4, 1)])
def test_a_chunk_s_rows_are_the_numpy_attention(kernels, d, heads, kv_heads):
    rng = np.random.default_rng(d + heads)
    spans = ((70, 77), (0, 40))  # a chunk after a prefix (partial tiles) and a chunk from the start
    tables = [list(range(0, 3)), list(range(3, 4))]
    k_cache, v_cache = (rng.standard_normal((4, kv_heads, BLOCK, d)).astype(np.float16) for _ in range(2))
    n = sum(count for _, count in spans)
    q = rng.standard_normal((n, heads, d)).astype(np.float16)
    step = Step(n, spans[0][0], tuple(tables), spans=spans, q_start=np.array([0, 77, n], dtype=np.int32),
                pos0=np.array([70, 0], dtype=np.int32), table=np.array([0, 1, 2, 3], dtype=np.int32),
                table_off=np.array([0, 3], dtype=np.int32))
    got = kernels.attention(q, k_cache, v_cache, step)  # (n, heads * d) fp16
    want = ArrayOps(np).attention(q.astype(np.float32), k_cache.astype(np.float32), v_cache.astype(np.float32), step)
    np.testing.assert_allclose(got.astype(np.float32), want, rtol=0, atol=4e-3)
