"""The n-gram drafter (engine/runner/ngram_draft.py): what it proposes and how its draft length follows
the request's acceptance."""
from engine.runner.draft_pace import MISSES_TO_REST, REST_STEPS
from engine.runner.ngram_draft import NgramDrafter


def test_it_proposes_what_followed_the_latest_earlier_occurrence_of_the_longest_tail():
    d = NgramDrafter([1, 2, 3, 4, 5, 9, 2, 3, 4, 7, 8, 6, 2, 3, 4], most=3)
    assert d.propose() == [7, 8, 6]  # [2, 3, 4] last occurred before 7, 8, 6 (not before 5)
    d.extend([7])
    assert d.propose() == [8, 6, 2]  # [3, 4, 7] now matches its earlier occurrence


def test_nothing_is_proposed_without_an_earlier_occurrence():
    assert NgramDrafter([1, 2, 3, 4, 5], most=4).propose() == []
    assert NgramDrafter([5], most=4).propose() == []


def test_the_draft_length_follows_acceptance_and_rests_after_repeated_misses():
    d = NgramDrafter([1, 2, 3, 1, 2, 3, 1, 2], most=8)
    d.verified(8, 8)
    assert d.k == 8 and (d.drafted, d.accepted) == (8, 8)
    d.verified(8, 2)
    assert d.k == 3
    for _ in range(MISSES_TO_REST):
        d.verified(d.k, 0)
    assert [d.propose() for _ in range(REST_STEPS)] == [[]] * REST_STEPS  # a request that gains nothing pays nothing
    assert d.propose() == [3]  # then it probes again with one token
