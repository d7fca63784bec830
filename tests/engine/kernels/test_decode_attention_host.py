"""attention.cu's flash-decoding kernels for 256-wide heads (the hybrid families'), the CUDA source itself run on
the host (host_cuda.py: each block's warps as fibers meeting at their shuffles and barriers, the last block of a
sequence merging the splits), through their launcher (engine/kernels/attention_launch.py decode_attention): each
sequence's row against the NumPy attention of engine/ops/backend.py, for groups that take one and two query
heads a block, short sequences and long ones cut into splits."""
import numpy as np
import pytest

from engine.core.step import Step, pack_tables
from engine.kernels.attention_launch import AttentionLaunchers, MAX_COUNTER_HEADS
from engine.kernels.limits import COUNTER_SEQUENCES
from engine.ops.backend import ArrayOps
from tests.engine.kernels.host_cuda import HostKernels, compiler

D, BLOCK = 256, 64


@pytest.fixture(scope="module")
def kernels(tmp_path_factory):
    assert compiler() is not None, "a C++ compiler (g++) is needed to run the kernels on the CPU"
    launcher = AttentionLaunchers()
    launcher.cp, launcher.sms = np, 4
    launcher.counters = np.zeros(COUNTER_SEQUENCES * MAX_COUNTER_HEADS, dtype=np.int32)
    launcher.fn = {}
    for part, heads in ((19, 1), (20, 2)):  # attention.cu's parts of the 256-wide decoding kernels
        launcher.fn.update(HostKernels("attention.cu", tmp_path_factory.mktemp(f"attention{part}"),
                                       (f"flash_decode_d{D}_g{heads}",), defines=("PARTS=21", f"PART={part}")))
    return launcher


@pytest.mark.parametrize("heads, kv_heads", [(16, 2), (6, 2), (5, 1), (2, 2)], ids=["g8", "g3", "g5", "g1"])
def test_each_sequence_s_row_is_the_numpy_attention(kernels, heads, kv_heads):
    rng = np.random.default_rng(heads)
    positions = (70, 3100)  # one split, and a sequence cut into splits that the last block merges
    tables = [list(range(0, 2)), list(range(2, 2 + -(-3101 // BLOCK)))]
    blocks = tables[-1][-1] + 1
    k_cache, v_cache = (rng.standard_normal((blocks, kv_heads, BLOCK, D)).astype(np.float16) for _ in range(2))
    q = rng.standard_normal((2, heads, D)).astype(np.float16)
    width = max(len(t) for t in tables)
    step = Step(2, -1, tuple(tables), positions, pos0=np.asarray(positions, dtype=np.int32),
                table=pack_tables(tables, width), table_off=np.arange(0, 2 * width, width, dtype=np.int32))
    got = kernels.decode_attention(q, k_cache, v_cache, step)  # (2, heads * D) fp16
    want = ArrayOps(np).attention(q.astype(np.float32), k_cache.astype(np.float32), v_cache.astype(np.float32), step)
    np.testing.assert_allclose(got.astype(np.float32), want, rtol=0, atol=3e-3)
    assert not kernels.counters.any()  # the last block of each (sequence, K/V head group) reset its counter
