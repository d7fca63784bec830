"""A request's state in the engine (engine/runner/sequence.py)."""
from engine.runner.sampler import Sampler, SamplingParams
from engine.runner.sequence import Sequence


def made(ident: int) -> Sequence:
    return Sequence(id=ident, prompt=(1, 2, 3), max_new=8, sampler=Sampler(SamplingParams(), (1, 2, 3)),
                    stop_ids=frozenset())


def test_a_request_is_its_own_object_whatever_its_fields():
    """The loop asks `seq in line` of lists of requests every round: identity, not a comparison of every field
    (the fields' comparison was a third of a 64-row decode step's host time in the mock engine's loop)."""
    a, twin = made(1), made(1)
    assert a == a and a != twin  # (the same fields, another request)
    assert a in [made(2), a] and twin not in [made(2), a]
    assert len({a, twin}) == 2  # (hashable by identity: sets of requests)
