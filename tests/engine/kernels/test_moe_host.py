"""moe.cu's expert kernels, the CUDA source itself run on the host (host_cuda.py: warps as fibers, mma.sync
emulated), through their launcher (engine/kernels/moe_launch.py): a decode step's experts (moe_matvec, moe_down)
and a prompt chunk's (moe_sort, moe_gemm on the tensor cores, moe_combine) against engine/ops/moe.py's NumPy
mixture over gguf's values of the same blocks, and each decode row the bits of that row alone. For the IQ types
(Qwen3-Next's files are IQ3_S), beside Q4_K, whose kernels a GPU has checked; and a decode step's gate, up and
SwiGLU in one launch (moe_act) the bits of the three apart."""
import numpy as np
import pytest

from engine.core.experts import Experts, ExpertStack
from engine.core.quantized import BLOCKS, Row8
from engine.kernels.matvec_launch import MatvecLaunchers
from engine.kernels import KERNEL_DIR
from engine.kernels.moe_launch import (GEMM_BM, GEMM_BN, GEMM_THREADS, KERNELS, ROUTE_K, ROUTE_THREADS, ROUTE_TILE,
                                       MoeKernels)
from engine.kernels.norm_rope_launch import NormRopeLaunchers
from engine.ops.backend import ArrayOps
from engine.ops.moe import route, run_experts
from gguf import GGMLQuantizationType, quants
from tests.engine.kernels.host_cuda import HostKernels, compiler
from tests.engine.kernels.test_kernels_sm90 import constants
from tests.engine.kernels.test_quant_blocks_host import random_blocks
from tools.checks.fused_kernels import moe_act_case

KINDS = ("Q4_K", "IQ3_S", "IQ2_XS")
EXPERTS, DIM, FFN, K = 4, 256, 256, 2


class Launchers(MatvecLaunchers, NormRopeLaunchers):
    """What MoeKernels reads of GpuKernels (cp, fn, quantize_q8, silu_mul), over NumPy and the host's kernels."""


@pytest.fixture(scope="module")
def moe(tmp_path_factory) -> MoeKernels:
    assert compiler() is not None, "a C++ compiler (g++) is needed to run the kernels on the CPU"
    work = tmp_path_factory.mktemp("moe")
    k = Launchers()
    k.cp, k.fn = np, {}
    k.fn.update(HostKernels("moe.cu", work, tuple(n for n in KERNELS if not n.startswith("moe_") or n.endswith(KINDS)
                                                  or n in ("moe_sort", "moe_combine", "moe_route"))))
    k.fn.update(HostKernels("norm_rope.cu", work, ("silu_mul", "add_rms_norm")))
    k.fn.update(HostKernels("quant.cu", work, ("quantize_q8",), defines=("PARTS=30", "PART=0")))
    return MoeKernels(k)


def stacks(kind: str, seed: int) -> tuple[Experts, Experts]:
    """Random experts in `kind` blocks (gate, up: (EXPERTS*FFN, DIM); down: (EXPERTS*DIM, FFN)), and the same as
    gguf's float32 values."""
    blocked, values = [], []
    for i, (rows, cols) in enumerate(((FFN, DIM), (FFN, DIM), (DIM, FFN))):
        raw = random_blocks(kind, EXPERTS * rows * cols // BLOCKS[kind][0], seed + i).reshape(EXPERTS * rows, -1)
        blocked.append(ExpertStack(kind, raw, EXPERTS, rows, cols))
        w = quants.dequantize(raw, GGMLQuantizationType[kind]).reshape(EXPERTS * rows, cols).astype(np.float32)
        values.append(ExpertStack("F32", w, EXPERTS, rows, cols))
    return Experts(*blocked), Experts(*values)


def reference(h, values: Experts, chosen, weights) -> np.ndarray:
    return run_experts(ArrayOps(np), h.astype(np.float32), values, chosen, weights)


def close(got, want) -> None:
    np.testing.assert_allclose(got.astype(np.float32), want, rtol=0, atol=0.03 * float(np.abs(want).max()))


@pytest.mark.parametrize("kind", KINDS)
def test_a_decode_step_s_experts_match_numpy_and_each_row_is_its_own(moe, kind):
    blocked, values = stacks(kind, seed=1)
    rng = np.random.default_rng(2)
    h = (rng.standard_normal((3, DIM)) * 0.5).astype(np.float16)
    chosen = np.array([[0, 3], [2, 1], [3, 2]], dtype=np.int32)
    weights = np.array([[0.7, 0.3], [0.55, 0.45], [0.6, 0.4]], dtype=np.float32)
    together = moe.decode(Row8(h, None), blocked, chosen, weights)  # (3, DIM) fp16
    close(together, reference(h, values, chosen, weights))
    alone = moe.decode(Row8(h[1:2], None), blocked, chosen[1:2], weights[1:2])
    assert np.array_equal(alone, together[1:2])


@pytest.mark.parametrize("kind", KINDS)
def test_the_experts_gate_up_and_swiglu_in_one_launch_give_the_bits_of_three(moe, kind):
    """moe_act_<kind> (a decode step's gate and up with SwiGLU in the epilogue) against moe_matvec then silu_mul:
    three rows of two experts each, and a lone row."""
    rng = np.random.default_rng(6)
    assert moe_act_case(moe, np, kind, EXPERTS, DIM, FFN, 3, K, rng)
    assert moe_act_case(moe, np, kind, EXPERTS, DIM, FFN, 1, K, rng)


@pytest.mark.parametrize("kind", KINDS)
def test_a_prompt_chunk_s_experts_match_numpy(moe, kind):
    blocked, values = stacks(kind, seed=4)
    rng = np.random.default_rng(5)
    h = (rng.standard_normal((37, DIM)) * 0.5).astype(np.float16)
    chosen = np.stack([rng.choice(EXPERTS, K, replace=False) for _ in range(37)]).astype(np.int32)
    weights = rng.dirichlet(np.ones(K), 37).astype(np.float32)
    close(moe.prompt(h, blocked, chosen, weights), reference(h, values, chosen, weights))


@pytest.mark.parametrize("kind", ("Q4_K", "IQ3_S"))
def test_an_expert_past_a_tile_and_a_row_alone_give_the_chunk_s_bits(moe, kind):
    """A chunk where expert 0 has 150 entries (two of moe_gemm's row tiles, the second part full) and the others a
    few (warps past their last entry): NumPy's values, and a token's row read alone the bits of its row in the
    chunk (each output row is computed alone, whatever the tile holds)."""
    blocked, values = stacks(kind, seed=4)
    rng = np.random.default_rng(5)
    n = 150
    h = (rng.standard_normal((n, DIM)) * 0.5).astype(np.float16)
    chosen = np.stack([[0, rng.integers(1, EXPERTS)] for _ in range(n)]).astype(np.int32)
    weights = rng.dirichlet(np.ones(K), n).astype(np.float32)
    chunk = moe.prompt(h, blocked, chosen, weights)
    close(chunk, reference(h, values, chosen, weights))
    for t in (7, 149):
        assert np.array_equal(moe.prompt(h[t:t + 1], blocked, chosen[t:t + 1], weights[t:t + 1]), chunk[t:t + 1])


@pytest.mark.parametrize("decode", [False, True], ids=["chunk", "decode"])
def test_512_experts_are_routed_as_numpy_routes_them(moe, decode):
    """Qwen3-Next's 512 experts, 10 a token: router_gemm and moe_route (a chunk's), router_route (a decode
    step's) against engine/ops/moe.py's softmax and top-k over the same logits."""
    rng = np.random.default_rng(9)
    h = rng.standard_normal((2, 64)).astype(np.float16)
    router = (rng.standard_normal((512, 64)) * 0.3).astype(np.float32)
    chosen, weights = moe.route(h, router, 10, True, decode=decode)
    want_chosen, want_weights = route(h.astype(np.float32) @ router.T, 10, True)
    assert np.array_equal(chosen, want_chosen)
    np.testing.assert_allclose(weights, want_weights, rtol=1e-5)


def test_what_the_device_bench_times_runs_on_the_host_kernels(moe):
    """tools/device/moe_gemm_bench.py's layer, what a device call times, over the host's kernels at a small shape:
    its gate GEMM alone gives each grouped entry its token's row times its expert's gate matrix (gguf's values), its
    row tiles are each expert's entries in GEMM_BM tiles, its route NumPy's, and its pass runs."""
    from gguf import GGMLQuantizationType
    from tools.device.moe_gemm_bench import Layer

    n, experts, used, dim, ffn = 37, 4, 2, 256, 256
    layer = Layer(np, moe, "Q4_K", n, experts, used, dim, ffn, np.random.default_rng(3))
    runs = layer.launches()
    chosen, _ = runs["route"]()
    assert np.array_equal(chosen, route(layer.h.astype(np.float32) @ layer.router.T, used, True)[0])
    runs["gate"]()
    order, offsets, tiles, _ = layer.groups
    gate = quants.dequantize(layer.experts.gate.data, GGMLQuantizationType.Q4_K).reshape(experts, ffn, dim)
    for e in range(experts):
        for p in range(offsets[e], offsets[e + 1]):
            want = layer.h[order[p] // used].astype(np.float32) @ gate[e].T
            np.testing.assert_allclose(layer.gate_up[p, :ffn].astype(np.float32), want, atol=0.03 * np.abs(want).max())
    counts = np.bincount(layer.chosen.reshape(-1), minlength=experts)
    assert tiles[-1] == sum(-(-c // GEMM_BM) for c in counts)
    assert runs["pass"]().shape == (n, dim) and runs["down"]() is None


def test_a_chunk_s_route_of_a_row_is_the_row_s_alone(moe):
    """router_gemm's tiles (64 tokens, 64 experts): 70 rows over two row tiles and 130 experts over three, every
    logit summed in the same order whatever the tile, so a row routed alone gets the bits it gets in the chunk;
    and NumPy's choices."""
    rng = np.random.default_rng(12)
    h = rng.standard_normal((70, 96)).astype(np.float16)
    router = (rng.standard_normal((130, 96)) * 0.3).astype(np.float32)
    chosen, weights = moe.route(h, router, 8, True)
    assert np.array_equal(chosen, route(h.astype(np.float32) @ router.T, 8, True)[0])
    for t in (0, 63, 64, 69):
        alone = moe.route(h[t:t + 1], router, 8, True)
        assert np.array_equal(alone[0], chosen[t:t + 1]) and np.array_equal(alone[1], weights[t:t + 1])


def test_the_launchers_gemm_tiles_are_the_kernels():
    """The grouped GEMM's and the router's tile and block sizes the launcher sizes its grids by are moe.cu's own
    (written on both sides: a launcher's smaller tile would leave entries unread)."""
    c = constants((KERNEL_DIR / "moe.cu").read_text())
    assert (c["GEMM_BM"], c["GEMM_BN"], c["GEMM_THREADS"]) == (GEMM_BM, GEMM_BN, GEMM_THREADS)
    assert (c["ROUTE_TILE"], c["ROUTE_K"], c["ROUTE_THREADS"]) == (ROUTE_TILE, ROUTE_K, ROUTE_THREADS)
