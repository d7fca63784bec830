"""norm_rope.cu's Q/K-normed RoPE and K/V write (norm_rope_store), the CUDA source itself run on the host
(host_cuda.py), through its launcher, for the hybrid families' 256-wide heads with their partial rotation laid out
full-width (engine/model/hybrid_weights.py: zero frequencies past rope_dim / 2): the rotated queries and the rows
written into the pool against engine/ops/backend.py's NumPy rope_store, a prompt chunk's and a decode batch's; and
the hybrids' gated feed-forward sum with the next norm in one kernel (add_gated_rms_norm) against NumPy's gated sum
then norm, each row the bits it has in any step."""
import numpy as np
import pytest

from engine.core.deferred import GatedSum
from engine.core.quantized import quantize_q8
from engine.core.step import Step, pack_tables
from engine.kernels.norm_rope_launch import NormRopeLaunchers
from engine.ops.backend import ArrayOps
from tests.engine.kernels.host_cuda import HostKernels, compiler, q8_values

D, HEADS, KV_HEADS, BLOCK, ROPE_DIM = 256, 4, 2, 64, 64


@pytest.fixture(scope="module")
def kernels(tmp_path_factory):
    assert compiler() is not None, "a C++ compiler (g++) is needed to run the kernels on the CPU"
    k = NormRopeLaunchers()
    k.cp, k.fn = np, HostKernels("norm_rope.cu", tmp_path_factory.mktemp("norm_rope"),
                                 ("norm_rope_store", "add_gated_rms_norm"))
    return k


def tables(positions: int):
    """cos, sin (positions, 1, D/2) float32: rope_dim/2 frequencies, then zeros (the partial rotation's layout)."""
    inv = np.concatenate([10000.0 ** (-np.arange(0, ROPE_DIM, 2) / ROPE_DIM), np.zeros(D // 2 - ROPE_DIM // 2)])
    angles = np.outer(np.arange(positions), inv)
    return (np.cos(angles).astype(np.float32)[:, None, :], np.sin(angles).astype(np.float32)[:, None, :])


@pytest.mark.parametrize("decode", [False, True], ids=["chunk", "batch"])
def test_rotated_queries_and_written_rows_are_numpy_s(kernels, decode):
    rng = np.random.default_rng(int(decode))
    n = 3 if decode else 21
    qkv = rng.standard_normal((n, (HEADS + 2 * KV_HEADS) * D)).astype(np.float16)
    norms = (1 + 0.1 * rng.standard_normal(D)).astype(np.float32), (1 + 0.1 * rng.standard_normal(D)).astype(np.float32)
    cos, sin = tables(200)
    if decode:  # three sequences, a row each, at their own positions through their own tables
        tabs, positions = [[0, 1], [2], [3, 4, 5]], (70, 10, 130)
        step = Step(n, -1, tuple(tabs), positions, pos0=np.array(positions, dtype=np.int32),
                    table=pack_tables(tabs, 3), table_off=np.array([0, 3, 6], dtype=np.int32))
    else:  # a chunk of 21 positions from 50, across a block boundary
        step = Step(n, 50, ([1, 4],), pos0=np.array([50], dtype=np.int32), table=np.array([1, 4], dtype=np.int32),
                    table_off=np.array([0], dtype=np.int32))
    pools = [np.zeros((6, KV_HEADS, BLOCK, D), dtype=np.float16) for _ in range(2)]
    q = kernels.rope_store(qkv, cos, sin, *pools, step, (*norms, 1e-6))
    want_pools = [np.zeros((6, KV_HEADS, BLOCK, D), dtype=np.float32) for _ in range(2)]
    want_q = ArrayOps(np).rope_store(qkv.astype(np.float32), cos, sin, *want_pools, step, (*norms, 1e-6))
    np.testing.assert_allclose(q.astype(np.float32), want_q, rtol=0, atol=1e-2)
    for got, want in zip(pools, want_pools):
        np.testing.assert_allclose(got.astype(np.float32), want, rtol=0, atol=1e-2)
        assert np.count_nonzero(want) > 0


def test_the_gated_sum_and_the_norm_in_one_kernel_are_numpy_s_and_each_row_its_own(kernels):
    """x += routed + shared * sigmoid(h . w) then rms_norm(x) * weight, 5 rows of 2048 (the 80B-A3B shape's width):
    near NumPy's float32 sum and norm, the residual stream too; the rows taken 2 + 3 give the bits of the 5 at once
    (prompt rows and decode rows take the same kernel); the 8-bit units those quantize_q8 makes of the output."""
    rng = np.random.default_rng(9)
    n, dim = 5, 2048
    routed, shared, h = (rng.standard_normal((n, dim)).astype(np.float16) for _ in range(3))
    gate_w = (rng.standard_normal((1, dim)) * 0.05).astype(np.float32)
    weight = (1 + 0.1 * rng.standard_normal(dim)).astype(np.float32)
    x0 = rng.standard_normal((n, dim)).astype(np.float32)
    ref = ArrayOps(np)
    want_x = x0.copy()
    want = ref.add_rms_norm(want_x, GatedSum(*(a.astype(np.float32) for a in (routed, shared, h)), gate_w), weight, 1e-6)
    x = x0.copy()
    got = kernels.add_gated_rms_norm(x, GatedSum(routed, shared, h, gate_w), weight, 1e-6, q8=True)
    np.testing.assert_allclose(got.values.astype(np.float32), want, rtol=0, atol=2e-2)
    np.testing.assert_allclose(x, want_x, rtol=0, atol=2e-3)
    parts = [x0[:2].copy(), x0[2:].copy()]
    halves = [kernels.add_gated_rms_norm(part, GatedSum(routed, shared, h, gate_w).take(rows), weight, 1e-6)
              for part, rows in zip(parts, (slice(0, 2), slice(2, n)))]
    assert np.array_equal(np.concatenate(halves), got.values) and np.array_equal(np.concatenate(parts), x)
    assert np.array_equal(q8_values(got.q8), quantize_q8(got.values.reshape(-1)))
