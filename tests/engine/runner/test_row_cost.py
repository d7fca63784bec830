"""A drafted row's cost as the decode forwards measure it (engine/runner/row_cost.py)."""
import pytest

from engine.runner.row_cost import CEILING, FLOOR, RowCost


def test_the_prior_stands_until_the_row_counts_differ():
    cost = RowCost(prior=0.75)
    assert cost.fraction(1) == 0.75 and cost.step_seconds(1) is None
    for _ in range(10):
        cost.observe(1, 0.080)
    assert cost.fraction(1) == 0.75 and cost.step_seconds(1) == pytest.approx(0.080)


def test_the_line_through_the_forwards_gives_a_row_s_share():
    cost = RowCost(prior=0.75)
    for rows in (1, 9, 1, 3, 1, 5):
        cost.observe(rows, 0.020 + 0.060 * rows)  # a CPU's forward: each row a pass over the weights
    assert cost.fraction(1) == pytest.approx(0.060 / 0.080)
    assert cost.fraction(4) == pytest.approx(4 * 0.060 / 0.260)  # against each of four requests' share
    assert cost.step_seconds(2) == pytest.approx(0.140)


def test_a_given_cost_is_kept_and_a_noisy_fit_is_bounded():
    assert RowCost(prior=0.75, fixed=0.0).fraction(3) == 0.0
    flat = RowCost(prior=0.75)
    for rows, seconds in ((1, 0.010), (8, 0.009), (1, 0.011), (8, 0.009)):
        flat.observe(rows, seconds)  # more rows no slower (padding, noise)
    assert flat.fraction(1) == FLOOR
    steep = RowCost(prior=0.75)
    for rows, seconds in ((1, 0.001), (2, 1.0)):
        steep.observe(rows, seconds)
    assert steep.fraction(2) <= CEILING


def test_a_forward_far_slower_than_the_others_is_not_counted():
    cost = RowCost(prior=0.75)
    for rows in (1, 3, 1, 3):
        cost.observe(rows, 0.010 * rows)
    before = cost.line()
    cost.observe(2, 2.0)  # a decode graph captured in this step
    assert cost.line() == before


def test_a_draft_model_s_token_adds_its_forward_against_the_step():
    cost = RowCost(prior=0.75)
    assert cost.draft_fraction(1, None, 0.36) == 0.75 + 0.36  # nothing measured: the files' sizes compare
    for rows in (1, 3, 1, 3):
        cost.observe(rows, 0.100 * rows)  # a step: a row 0.1 s
    assert cost.draft_fraction(1, 0.025, 0.36) == pytest.approx(1.0 + 0.25)  # a draft forward a quarter of a step
    assert RowCost(prior=0.75, fixed=0.0).draft_fraction(1, 0.025, 0.36) == 0.0  # a given cost stands alone
