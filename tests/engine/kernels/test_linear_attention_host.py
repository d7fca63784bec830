"""linear_attention.cu's kernels through their launchers (engine/kernels/linear_attention_launch.py), run on the
CPU one thread at a time (host_cuda.py), against the NumPy mixer (engine/ops/gated_delta_net.py), and the
exactness the GPU path promises: a position's output and state are the same bits however its read is cut (at a
chunk boundary, or short of one and read again from the mark) and whatever else shares the step."""
import numpy as np
import pytest

from engine.core.quantized import quantize_q8
from engine.core.step import Step
from engine.kernels import KERNEL_DIR
from engine.kernels import linear_attention_launch as launch
from engine.kernels.linear_attention_launch import LinearAttentionLaunchers
from engine.kernels.loader import built_kernels
from engine.kvcache.recurrent import RecurrentState, SequenceState
from engine.model.layer_weights import LinearAttentionWeights
from engine.modelfile.model_config import HybridConfig
from engine.ops import gated_delta_net as gdn
from tests.engine.kernels.host_cuda import HostKernels, compiler, q8_values
from tests.engine.kernels.test_kernels_sm90 import constants

EPS = 1e-6
LAYERS, LAYER = 2, 1  # the states hold two linear-attention layers; the mixer runs the second


@pytest.fixture(scope="module")
def kernels(tmp_path_factory):
    assert compiler() is not None, "a C++ compiler (g++) is needed to run the kernels on the CPU"
    launchers = LinearAttentionLaunchers()
    launchers.cp = np
    launchers.fn = HostKernels("linear_attention.cu", tmp_path_factory.mktemp("host_cuda"),
                               built_kernels()["linear_attention.cu"])
    return launchers


@pytest.fixture(scope="module", params=[(False, 32), (True, 32), (False, 128)], ids=["grouped", "tiled", "d128"])
def layer(request):
    tiled, d = request.param  # (d 128: Qwen3-Next's and Qwen3.5's heads)
    hy = HybridConfig(n_layers=4, interval=4, conv_kernel=4, k_heads=2, v_heads=4, dk=d, dv=d, rope_dim=16,
                      tiled=tiled)
    rng = np.random.default_rng(7)
    f32 = lambda *shape, scale=1.0: (rng.standard_normal(shape) * scale).astype(np.float32)  # noqa: E731
    lw = LinearAttentionWeights(w_in=None, conv=f32(hy.channels, hy.conv_kernel, scale=0.5),
                                a=-np.exp(f32(hy.v_heads, scale=0.5)), dt_bias=f32(hy.v_heads, scale=0.5),
                                norm=1 + f32(hy.dv, scale=0.1), w_out=None)
    return hy, lw


def projections(hy, n: int, seed: int) -> np.ndarray:
    """n rows of an in-projection's output [q | k | v | z | b | a], fp16 as the GPU's matmuls leave them."""
    width = hy.channels + hy.v_heads * hy.dv + 2 * hy.v_heads
    return np.random.default_rng(seed).standard_normal((n, width)).astype(np.float16)


def fresh(hy) -> SequenceState:
    return SequenceState.fresh(RecurrentState.zeros(LAYERS, hy.conv_kernel, hy.channels, hy.v_heads, hy.dk, hy.dv))


def read(kernels, hy, lw, state: SequenceState, proj, start: int):
    """proj's rows read as one prompt step from `start` (the state's mark) through the kernels -> (n, nv*dv)."""
    step = Step(len(proj), start, (None,))
    out = kernels.delta_net(proj, lw, hy, LAYER, kernels.state_pointers(step, (state,)), EPS)
    state.read(start, len(proj))
    return out


def decode(kernels, hy, lw, states, proj):
    """Row i of proj is states[i]'s next position, all in one decode step -> (n, nv*dv) (the 8-bit form the gated
    norm writes beside a decode row checked: quantize_q8's of its values)."""
    step = Step(len(proj), -1, tuple([None] * len(proj)), tuple(s.now_at for s in states))
    out = kernels.delta_net(proj, lw, hy, LAYER, kernels.state_pointers(step, tuple(states)), EPS, q8=True)
    assert np.array_equal(q8_values(out.q8), quantize_q8(out.values.reshape(-1)))
    for s in states:
        s.decoded()
    return out.values


def close(got, want):
    np.testing.assert_allclose(got.astype(np.float32), want, rtol=2e-3, atol=2e-3 * float(np.abs(want).max()))


def test_a_read_and_decode_rows_match_the_numpy_mixer(kernels, layer):
    hy, lw = layer
    proj = projections(hy, 100, seed=1)
    state, ref = fresh(hy), fresh(hy)
    close(read(kernels, hy, lw, state, proj, 0), gdn.mixer(proj.astype(np.float32), lw, hy, LAYER,
                                                           Step(100, 0, (None,)), (ref,), EPS))
    ref.read(0, 100)
    for mine, theirs in ((state.now, ref.now), (state.mark, ref.mark)):  # the mark: after row 64, the last boundary
        assert np.array_equal(mine.conv, theirs.conv)  # the convolution's window holds inputs, as they are
        np.testing.assert_allclose(mine.ssm, theirs.ssm, rtol=1e-4, atol=1e-5)
    assert not np.array_equal(state.mark.ssm, state.now.ssm) and state.mark_at == 64
    rows = projections(hy, 1, seed=2)
    close(decode(kernels, hy, lw, [state], rows),
          gdn.mixer(rows.astype(np.float32), lw, hy, LAYER, Step(1, -1, (None,), (100,)), (ref,), EPS))
    np.testing.assert_allclose(state.now.ssm, ref.now.ssm, rtol=1e-4, atol=1e-5)


def test_a_position_s_bits_do_not_depend_on_how_its_read_is_cut(kernels, layer):
    hy, lw = layer
    proj = projections(hy, 101, seed=3)
    whole = fresh(hy)
    all_rows = read(kernels, hy, lw, whole, proj, 0)
    cut = fresh(hy)  # cut at a chunk boundary: the rest continues from the mark
    first = read(kernels, hy, lw, cut, proj[:64], 0)
    rest = read(kernels, hy, lw, cut, proj[64:], 64)
    assert np.array_equal(np.concatenate([first, rest]), all_rows)
    assert np.array_equal(cut.now.ssm, whole.now.ssm) and np.array_equal(cut.now.conv, whole.now.conv)
    assert np.array_equal(cut.mark.ssm, whole.mark.ssm) and cut.mark_at == whole.mark_at == 64
    again = fresh(hy)  # a read cut short of a boundary is read again from its mark: the same bits
    read(kernels, hy, lw, again, proj[:80], 0)
    again.rewind()
    assert np.array_equal(read(kernels, hy, lw, again, proj[64:101], 64), all_rows[64:])
    assert np.array_equal(again.now.ssm, whole.now.ssm)


def test_a_decoded_position_continues_the_read_s_state_in_the_recurrent_form(kernels, layer):
    """A decode row after a read (the recurrent form from `now`) equals the same position read (the chunked form)
    up to the two forms' rounding, and leaves the mark where the read put it."""
    hy, lw = layer
    proj = projections(hy, 101, seed=3)
    whole = fresh(hy)
    all_rows = read(kernels, hy, lw, whole, proj, 0)
    state = fresh(hy)
    read(kernels, hy, lw, state, proj[:100], 0)
    close(decode(kernels, hy, lw, [state], proj[100:]), all_rows[100:].astype(np.float32))
    np.testing.assert_allclose(state.now.ssm, whole.now.ssm, rtol=1e-4, atol=1e-5)
    assert state.mark_at == 64 and np.array_equal(state.mark.ssm, whole.mark.ssm)


def test_sequences_sharing_a_step_get_each_its_bits_alone(kernels, layer):
    hy, lw = layer
    a, b = projections(hy, 70, seed=4), projections(hy, 30, seed=5)
    alone = [read(kernels, hy, lw, fresh(hy), p, 0) for p in (a, b)]
    sa, sb = fresh(hy), fresh(hy)
    step = Step(100, 0, (None, None), spans=((0, 70), (0, 30)))
    both = kernels.delta_net(np.concatenate([a, b]), lw, hy, LAYER, kernels.state_pointers(step, (sa, sb)), EPS)
    assert np.array_equal(both, np.concatenate(alone))
    sa.read(0, 70), sb.read(0, 30)
    rows = projections(hy, 2, seed=6)  # then one decode step for both, against each decoded alone
    pair = decode(kernels, hy, lw, [sa, sb], rows)
    solo = fresh(hy)
    read(kernels, hy, lw, solo, b, 0)
    assert np.array_equal(decode(kernels, hy, lw, [solo], rows[1:]), pair[1:])


def test_the_attention_gate_matches_numpy(kernels):
    rng = np.random.default_rng(8)
    x, gate = (rng.standard_normal((5, 96)).astype(np.float16) for _ in range(2))
    gated = kernels.sigmoid_mul(x, gate, q8=True)
    close(gated.values, x.astype(np.float32) * gdn.sigmoid(gate.astype(np.float32)))
    assert np.array_equal(gated.values, kernels.sigmoid_mul(x, gate))
    assert np.array_equal(q8_values(gated.q8), quantize_q8(gated.values.reshape(-1)))


def test_the_launchers_geometry_is_the_kernels():
    """The block sizes and the chunk the launchers size their grids and buffers by are linear_attention.cu's own
    (each is written on both sides)."""
    c = constants((KERNEL_DIR / "linear_attention.cu").read_text())
    assert (c["LA_THREADS"], c["CHUNK"], c["CHUNK_THREADS"], c["TILE"]) == \
        (launch.LA_THREADS, launch.CHUNK, launch.CHUNK_THREADS, launch.TILE)
