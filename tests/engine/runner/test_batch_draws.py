"""The GPU's batched temperature draws, as far as the CPU can check them: draw_segmented (the kernels'
arithmetic in NumPy, engine/runner/batch_draws.py) gives the host sampler's tokens but where the uniform
falls within rounding of a boundary, and cuts exactly as it does; and engine/runner/picks.py routes
every token of a plain sampling request through the batch, one uniform a token, whether the request is
drawn with its step's rows or alone. The kernels themselves: tools/device/gpu_kernels_check.py."""
import numpy as np
import pytest

from engine.runner.batch_draws import draw_segmented
from engine.runner.picks import Picks
from engine.runner.sampler import Sampler, SamplingParams, pick, scale
from engine.runner.sequence import Sequence


def model_like_logits(seed: int, vocab: int = 49152) -> np.ndarray:
    """A few strong candidates over a broad tail, as a language model's."""
    rng = np.random.default_rng(seed)
    logits = (rng.standard_normal(vocab) * 2).astype(np.float32)
    logits[rng.choice(vocab, 30, replace=False)] += 9
    return logits


@pytest.mark.parametrize("params", [SamplingParams(temperature=0.8), SamplingParams(temperature=1.0, top_p=0.9),
                                    SamplingParams(temperature=0.7, top_k=40, min_p=0.05),
                                    SamplingParams(temperature=1.3, min_p=0.1, top_p=0.95)],
                         ids=["plain", "top_p", "top_k_min_p", "min_p_top_p"])
def test_the_kernels_draw_is_the_host_samplers_but_at_rounding(params):
    agree, total = 0, 0
    for seed in (1, 2):
        scaled = scale(model_like_logits(seed), params)
        for u in np.random.default_rng(seed).random(60):
            agree += draw_segmented(scaled, float(u), params) == pick(scaled, float(u), params)
            total += 1
    assert agree >= total - 1, f"{total - agree} of {total} draws differ"


def test_the_cuts_are_the_samplers():
    scaled = scale(model_like_logits(3), SamplingParams(temperature=1.0))
    best = int(np.argmax(scaled))
    for params in (SamplingParams(temperature=1.0, top_k=1), SamplingParams(temperature=1.0, top_p=1e-9),
                   SamplingParams(temperature=1.0, min_p=1.0)):
        assert {draw_segmented(scaled, u, params) for u in (0.0, 0.5, 0.999999)} == {best}
    # a flat row: every candidate in play, the inverse CDF walks the whole order
    flat = np.zeros(5000, dtype=np.float32)
    assert [draw_segmented(flat, u, SamplingParams(temperature=1.0)) for u in (0.0, 0.5, 0.9999)] == [0, 2500, 4999]
    cut = SamplingParams(temperature=1.0, top_k=100)
    assert max(draw_segmented(flat, u, cut) for u in np.linspace(0, 0.9999, 50)) == 99


class FakeBatch:
    """BatchDraws' interface: records each call's rows (logits, params, u); token = the row's argmax."""

    rows = 64

    def __init__(self):
        self.calls = []

    def draw(self, rows, gather=None):
        self.calls.append(rows)
        return [int(np.argmax(logits)) for logits, _, _ in rows]


def sequence(i: int, params: SamplingParams) -> Sequence:
    seq = Sequence(id=str(i), prompt=(1, 2, 3), max_new=8, sampler=Sampler(params, (1, 2, 3)), stop_ids=frozenset())
    seq.logits = np.eye(10, dtype=np.float32)[i]
    return seq


def test_plain_draws_go_through_the_batch_with_one_uniform_each():
    picks = Picks(type("HostBackend", (), {"xp": np, "name": "cpu"})(), None, 10)  # the CPU's picks, the GPU's
    # batch faked
    picks.batch = FakeBatch()
    plain = [sequence(i, SamplingParams(temperature=0.8, seed=i)) for i in range(3)]
    greedy = sequence(5, SamplingParams())
    penalized = sequence(6, SamplingParams(temperature=0.8, repeat_penalty=1.2, seed=6))
    expected_u = [Sampler(SamplingParams(temperature=0.8, seed=i), ()).rng.random() for i in range(3)]
    picks.ahead([plain[0], greedy, plain[1], penalized, plain[2]])
    assert len(picks.batch.calls) == 1
    assert [u for _, _, u in picks.batch.calls[0]] == expected_u  # the step's rows, in order, a uniform each
    assert [picks.sample(seq) for seq in plain] == [0, 1, 2] and all(s.picked is None for s in plain)
    # alone (a prompt's last row): a batch of one, its next uniform
    second_u = Sampler(SamplingParams(temperature=0.8, seed=0), ()).rng.random(2)[1]
    assert picks.sample(plain[0]) == 0 and picks.batch.calls[-1][0][2] == second_u
    assert picks.sample(greedy) == 5 and len(picks.batch.calls) == 2  # greedy and penalized picks stay on their path
    assert picks.sample(penalized) in range(10) and len(picks.batch.calls) == 2
