"""Sampling: greedy, seeded determinism, top-k/top-p/min-p limits, penalties, validation."""
import numpy as np
import pytest
from hypothesis import given, strategies as st

from engine.runner.sampler import Sampler, SamplingParams, descending_order

LOGITS = np.log(np.array([0.5, 0.3, 0.15, 0.05], dtype=np.float32))


def draws(params: SamplingParams, n: int = 400) -> list[int]:
    s = Sampler(params, ())
    return [s.sample(LOGITS) for _ in range(n)]


def test_greedy_picks_the_argmax():
    assert set(draws(SamplingParams(temperature=0), 10)) == {0}


def test_same_seed_same_tokens_other_seed_other_tokens():
    a = draws(SamplingParams(temperature=1, seed=7))
    assert a == draws(SamplingParams(temperature=1, seed=7))
    assert a != draws(SamplingParams(temperature=1, seed=8))


def test_top_k_one_is_greedy():
    assert set(draws(SamplingParams(temperature=1, top_k=1, seed=1))) == {0}


def test_top_p_keeps_the_smallest_set_reaching_p():
    assert set(draws(SamplingParams(temperature=1, top_p=0.7, seed=1))) == {0, 1}


def test_min_p_drops_tokens_below_a_fraction_of_the_best():
    assert set(draws(SamplingParams(temperature=1, min_p=0.5, seed=1))) == {0, 1}


def test_temperature_sampling_follows_the_distribution():
    counts = np.bincount(draws(SamplingParams(temperature=1, seed=3), 4000), minlength=4) / 4000
    assert np.allclose(counts, [0.5, 0.3, 0.15, 0.05], atol=0.03)


def test_repeat_penalty_moves_greedy_off_a_recent_token():
    s = Sampler(SamplingParams(temperature=0, repeat_penalty=10.0), prompt=(0,))
    logits = np.array([2.0, 1.9, 0.0], dtype=np.float32)
    assert s.sample(logits) == 1


def test_frequency_and_presence_penalties_count_occurrences():
    s = Sampler(SamplingParams(temperature=0, frequency_penalty=0.5), prompt=(0, 0, 0))
    assert s.sample(np.array([2.0, 1.0], dtype=np.float32)) == 1
    s = Sampler(SamplingParams(temperature=0, presence_penalty=2.0), prompt=(0,))
    assert s.sample(np.array([2.0, 1.0], dtype=np.float32)) == 1


@pytest.mark.parametrize("bad", [{"temperature": -1}, {"top_p": 0}, {"top_p": 1.5}, {"top_k": -1},
                                 {"min_p": 2}, {"repeat_penalty": 0}, {"presence_penalty": 3}])
def test_invalid_values_are_refused_by_name(bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        SamplingParams(**bad)


@given(st.lists(st.sampled_from([0.0, -0.0, 1.5, -1.5, 3.0, float("-inf"), 7.25, -2.0]) |
                st.floats(-50, 50, allow_nan=False, width=32), min_size=1, max_size=300))
def test_descending_order_is_a_stable_descending_argsort(values):
    x = np.asarray(values, dtype=np.float32)
    assert np.array_equal(descending_order(x), np.argsort(-x, kind="stable"))


def test_sampling_does_not_modify_the_callers_logits():
    logits = np.array([2.0, 1.9, 0.0], dtype=np.float32)
    Sampler(SamplingParams(temperature=0, repeat_penalty=10.0), prompt=(0,)).sample(logits)
    assert logits.tolist() == [2.0, 1.899999976158142, 0.0]


@pytest.mark.parametrize("params", [SamplingParams(temperature=0.8, seed=3, top_k=3),
                                    SamplingParams(temperature=1.2, seed=9, min_p=0.2, repeat_penalty=1.3)])
def test_a_continuation_after_k_draws_samples_what_the_whole_run_samples(params):
    """What an engine restart relies on: a sampler built on prompt + the first k tokens with
    drawn=k draws the same rest as the sampler that drew all of them (RNG and penalty window)."""
    logits = np.random.default_rng(0).normal(size=(40, 64)).astype(np.float32)
    whole = Sampler(params, (1, 2, 3))
    tokens = []
    for row in logits:
        tokens.append(whole.sample(row))
        whole.accept(tokens[-1])
    k = 17
    cont = Sampler(params, (1, 2, 3, *tokens[:k]), drawn=k)
    rest = []
    for row in logits[k:]:
        rest.append(cont.sample(row))
        cont.accept(rest[-1])
    assert rest == tokens[k:]
    assert cont.state_digest() == whole.state_digest()


@given(st.lists(st.integers(-40, 40), min_size=1, max_size=200), st.floats(0, 0.999999),
       st.sampled_from([0.3, 1.0, 2.5]), st.sampled_from([0, 1, 7, 50]), st.sampled_from([1.0, 0.97, 0.6]),
       st.sampled_from([0.0, 0.02, 0.4]))
def test_a_draw_decided_on_a_sorted_prefix_equals_sorting_everything(ints, u, temperature, top_k, top_p, min_p):
    """The fast path sorts only the best candidates; the token must be the one a full sort gives.
    Logits on a coarse grid so that ties (broken by index) are common."""
    from engine.runner import sampler as module

    scaled = np.asarray(ints, dtype=np.float32) / np.float32(4 * temperature)
    params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)
    everything = module.pick(scaled, u, params)
    saved = module.PREFIXES
    try:
        for prefixes in [(1,), (2, 5), (3, 17, 60)]:
            module.PREFIXES = prefixes
            assert module.pick(scaled, u, params) == everything
    finally:
        module.PREFIXES = saved


@given(st.lists(st.integers(-40, 40), min_size=1, max_size=200), st.floats(0, 0.999999),
       st.sampled_from([0.3, 1.0, 2.5]), st.sampled_from([0, 1, 7, 50]), st.sampled_from([1.0, 0.97, 0.6]),
       st.sampled_from([0.0, 0.02, 0.4]))
def test_the_device_draw_written_over_numpy_equals_the_host_draw(ints, u, temperature, top_k, top_p, min_p):
    """pick_sorted is what the GPU runs (over cupy): the same weights, normalizer and cumulative
    sums as pick, with no host round trip between its steps. Over NumPy it must give pick's token."""
    from engine.runner.sampler import pick, pick_sorted

    scaled = np.asarray(ints, dtype=np.float32) / np.float32(4 * temperature)
    params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)
    assert pick_sorted(np, scaled, u, params) == pick(scaled, u, params)
    # the form a captured draw graph runs: u a 0-d array set before each replay, the token left as an array
    from engine.runner.sampler import draw_index

    assert int(draw_index(np, scaled, np.array(u), params)) == pick(scaled, u, params)


def test_plain_greedy_is_temperature_zero_with_no_penalty_in_effect():
    """The decode graph's argmax stands in for the sampler exactly when nothing rewrites the logits."""
    assert Sampler(SamplingParams(), (1, 2)).plain_greedy
    assert Sampler(SamplingParams(repeat_penalty=1.3), ()).plain_greedy  # nothing recent to penalize yet
    assert not Sampler(SamplingParams(repeat_penalty=1.3), (1, 2)).plain_greedy
    assert not Sampler(SamplingParams(presence_penalty=0.5), (4,)).plain_greedy
    assert not Sampler(SamplingParams(temperature=0.7), ()).plain_greedy
    penalized = Sampler(SamplingParams(frequency_penalty=1.0, repeat_last_n=0), (4,))
    assert penalized.plain_greedy  # a window of 0 keeps no recent tokens


class FakeDraws:
    """Records what the sampler hands a draw graph (engine/runner/sampling_graph.py needs a GPU): the uniform
    and the penalty counts in `calls`, a grammar's mask in `masks`; picks the first allowed token."""

    def __init__(self):
        self.calls, self.masks = [], []

    def draw(self, logits, u, p, counts, mask=None):
        from engine.runner.sampler import allowed_tokens

        self.calls.append((u, counts))
        self.masks.append(mask)
        return int(np.flatnonzero(allowed_tokens(np, mask, len(logits)))[0]) if mask is not None else 0


def test_a_draw_graph_gets_the_uniform_and_the_penalties_the_launched_pick_would_use():
    """After a decode graph the whole pick is a graph replay: it must consume exactly the uniforms
    the launched path consumes (one per temperature draw, none for greedy) and see the same
    penalty counts."""
    graphs = FakeDraws()
    plain = Sampler(SamplingParams(temperature=0.9, seed=3), (1,))
    assert plain.sample(LOGITS, np, graphs) == 0
    assert graphs.calls[-1] == (Sampler(SamplingParams(temperature=0.9, seed=3), (1,)).rng.random(), None)
    penalized = Sampler(SamplingParams(temperature=0, repeat_penalty=2.0), (1, 3, 1))
    penalized.sample(LOGITS, np, graphs)
    u, (ids, freq) = graphs.calls[-1]
    assert u is None and dict(zip(ids.tolist(), freq.tolist())) == {1: 2.0, 3: 1.0}
    before = penalized.rng.bit_generator.state
    penalized.sample(LOGITS, np, graphs)
    assert penalized.rng.bit_generator.state == before  # greedy draws no uniform


def test_penalties_over_a_padded_window_change_only_the_recent_tokens():
    """The draw graph pads the recent tokens to a fixed window with a sink slot past the
    vocabulary: the penalized logits must equal the unpadded penalties exactly."""
    from engine.runner.sampling_graph import padded
    from engine.runner.sampler import penalize

    params = SamplingParams(temperature=0.8, repeat_penalty=1.3, presence_penalty=0.4, frequency_penalty=0.2,
                            repeat_last_n=16)
    sampler = Sampler(params, (2, 0, 2, 3))
    want = sampler.apply_penalties(LOGITS)
    ids, freq = padded(sampler.penalty_counts(), 16, len(LOGITS))
    work = np.concatenate([LOGITS, np.zeros(1, np.float32)])
    penalize(np, work, ids, freq, params)
    np.testing.assert_array_equal(work[:-1], want)
    assert not np.array_equal(want, LOGITS)


def test_sampling_the_vocabulary_costs_well_under_a_millisecond_typically():
    """Not a timing assertion (the machine is shared): with logits shaped like a language model's
    (a few strong candidates over a broad tail) the fast path must rarely sort the whole
    vocabulary, which is what makes it cheap. Counted by patching the sort."""
    from engine.runner import sampler as module

    rng = np.random.default_rng(5)
    logits = (rng.standard_normal(49152) * 2).astype(np.float32)
    logits[rng.choice(49152, 30, replace=False)] += 12
    sorted_lengths = []
    original = module.descending_order
    module.descending_order = lambda x: (sorted_lengths.append(len(x)), original(x))[1]
    try:
        s = Sampler(SamplingParams(temperature=1.0, seed=2), ())
        for _ in range(100):
            s.sample(logits)
    finally:
        module.descending_order = original
    assert len(sorted_lengths) >= 100 and sum(n == 49152 for n in sorted_lengths) <= 5
