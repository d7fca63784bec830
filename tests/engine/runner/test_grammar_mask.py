"""A grammar's mask where the logits are: on the GPU the mask's words go to the device (4 KiB) and
the pick runs there (engine/runner/sampling_graph.py pick_on_device, also a captured graph's body), instead of
the logits coming to the host. The device forms are written over the array module, so here they run
over NumPy against the host path on the default model's real vocabulary and a real grammar."""
import llguidance
import numpy as np
import pytest

from engine.runner.sampling_graph import pick_on_device
from engine.modelfile.grammar_tokenizer import GrammarTokenizer
from engine.runner.grammar_mask import Constraint
from engine.runner.sampler import Sampler, SamplingParams, allowed_tokens
from tests.engine.runner.test_sampler import FakeDraws


@pytest.fixture(scope="module")
def grammars(tokenizer):
    return GrammarTokenizer(tokenizer, tokenizer.vocab_size)


def test_the_device_unpacking_of_the_mask_is_the_hosts(grammars, tokenizer):
    c = Constraint(grammars, llguidance.LLMatcher.grammar_from_regex("(Lyon|Marseille) [0-9]+"))
    words = c.mask_words()
    host = np.unpackbits(words.view(np.uint8), bitorder="little")[: tokenizer.vocab_size].view(bool)
    assert 0 < host.sum() < 200  # a handful of tokens start "Lyon" or "Marseille"
    np.testing.assert_array_equal(allowed_tokens(np, words, tokenizer.vocab_size), host)
    odd = np.random.default_rng(0).integers(0, 2**32, 5, dtype=np.uint64).astype(np.uint32)
    np.testing.assert_array_equal(allowed_tokens(np, odd, 150),  # a vocabulary not a multiple of 32
                                  np.unpackbits(odd.view(np.uint8), bitorder="little")[:150].view(bool))


@pytest.mark.parametrize("params", [SamplingParams(), SamplingParams(temperature=0.9, top_p=0.95, seed=4),
                                    SamplingParams(temperature=1.2, min_p=0.05, repeat_penalty=1.5, seed=9)])
def test_a_constrained_pick_on_the_device_is_the_hosts(grammars, tokenizer, params):
    """The same penalties, mask and draw as Sampler.sample on the host, token for token along a
    constrained answer (the mask changes at every token)."""
    grammar = llguidance.LLMatcher.grammar_from_regex("(Lyon|Marseille|Paris) is [a-z ]{3,20}\\.")
    rng = np.random.default_rng(1)
    host = Sampler(params, (5, 9, 5), constraint=Constraint(grammars, grammar))
    device = Sampler(params, (5, 9, 5), constraint=Constraint(grammars, grammar))
    for _ in range(12):
        logits = (rng.standard_normal(tokenizer.vocab_size) * 3).astype(np.float32)
        want = host.sample(logits)
        p = device.params
        counts = device.penalty_counts() if device.penalized else None
        u = device.rng.random() if p.temperature > 0 else 0.0
        got = int(pick_on_device(np, logits, np.array(u), *(counts or (None, None)), p,
                                 device.constraint.mask_words()))
        assert got == want
        host.accept(want)
        device.accept(got)
    assert host.constraint.matcher.is_error() is False


def test_after_a_decode_graph_a_constrained_pick_is_a_draw_graph_replay(grammars):
    """A constrained request no longer copies the logits to the host: the draw graph gets the mask."""
    draws = FakeDraws()
    s = Sampler(SamplingParams(), (), constraint=Constraint(grammars, llguidance.LLMatcher.grammar_from_regex("ab+")))
    token = s.sample(np.zeros(grammars.vocab_size, np.float32), np, draws)
    assert draws.masks[-1] is not None and allowed_tokens(np, draws.masks[-1], grammars.vocab_size)[token]
    Sampler(SamplingParams(temperature=0.5), ()).sample(np.zeros(4, np.float32), np, draws)
    assert draws.masks[-1] is None
