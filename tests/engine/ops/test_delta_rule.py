"""The gated delta rule (engine/ops/delta_rule.py): the chunked form against the recurrent one, and the
bits a position gets never depend on where its read ends or starts (at a chunk boundary)."""
import numpy as np
import pytest

from engine.ops import delta_rule as dr

HEADS, DK, DV = 3, 16, 8


def inputs(n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    q = dr.l2_normalize(rng.standard_normal((n, HEADS, DK)).astype(np.float32)) * np.float32(DK ** -0.5)
    k = dr.l2_normalize(rng.standard_normal((n, HEADS, DK)).astype(np.float32))
    v = rng.standard_normal((n, HEADS, DV)).astype(np.float32)
    g = -rng.uniform(0.0, 0.5, (n, HEADS)).astype(np.float32)
    beta = rng.uniform(0.1, 0.9, (n, HEADS)).astype(np.float32)
    return q, k, v, g, beta


def test_the_chunked_form_is_the_recurrence():
    n = 150  # two whole chunks and a cut one
    x = inputs(n)
    state = np.zeros((HEADS, DK, DV), np.float32)
    out = dr.read(state, *x)
    ref_state = np.zeros_like(state)
    ref = np.stack([dr.step(ref_state, *(a[t] for a in x)) for t in range(n)])
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(state, ref_state, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("cut", [1, 17, 63])
def test_a_position_has_the_same_bits_whether_its_chunk_is_cut_short_or_whole(cut):
    x = inputs(2 * dr.CHUNK, seed=1)
    whole = dr.read(np.zeros((HEADS, DK, DV), np.float32), *x)
    short = dr.read(np.zeros((HEADS, DK, DV), np.float32), *(a[:cut] for a in x))
    assert np.array_equal(short, whole[:cut])


def test_reads_cut_at_chunk_boundaries_give_the_whole_read_s_bits():
    x = inputs(3 * dr.CHUNK + 10, seed=2)
    whole_state = np.zeros((HEADS, DK, DV), np.float32)
    whole = dr.read(whole_state, *x)
    state, parts = np.zeros_like(whole_state), []
    for lo, hi in ((0, 64), (64, 192), (192, len(x[0]))):
        parts.append(dr.read(state, *(a[lo:hi] for a in x)))
    assert np.array_equal(np.concatenate(parts), whole) and np.array_equal(state, whole_state)


def test_the_convolution_carries_its_window_across_reads():
    rng = np.random.default_rng(3)
    x, w = rng.standard_normal((20, 5)).astype(np.float32), rng.standard_normal((5, 4)).astype(np.float32)
    whole, window = dr.causal_conv(x, np.zeros((3, 5), np.float32), w)
    first, mid = dr.causal_conv(x[:7], np.zeros((3, 5), np.float32), w)
    second, end = dr.causal_conv(x[7:], mid, w)
    assert np.array_equal(np.concatenate([first, second]), whole) and np.array_equal(end, window)
    ref = np.array([[sum(w[c, i] * (x[t - 3 + i, c] if t - 3 + i >= 0 else 0) for i in range(4)) for c in range(5)]
                    for t in range(20)], np.float32)
    np.testing.assert_allclose(whole, ref / (1 + np.exp(-ref)), rtol=1e-5, atol=1e-6)
