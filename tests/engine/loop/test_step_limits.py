"""StepLimits.capped_rows: a prompt step's rows under --step-ms by its estimate a row."""
from engine.loop.step_limits import STEP_ROWS_ALIGN, STEP_ROWS_FLOOR, StepLimits


def test_rows_fit_the_time_aligned_down_and_never_below_the_floor():
    limits = StepLimits(step_ms=80.0)
    assert limits.capped_rows(2048, 0.05) == 1536  # 1,600 rows fit 80 ms: 1,536 aligned
    assert limits.capped_rows(2048, 0.001) == 2048  # a fast step keeps its rows
    assert limits.capped_rows(2048, 10.0) == STEP_ROWS_FLOOR  # a slow one keeps the floor's
    assert limits.capped_rows(100, 10.0) == 100  # never more rows than it had
    assert 1536 % STEP_ROWS_ALIGN == 0


def test_no_bound_without_step_ms_or_an_estimate():
    assert StepLimits().capped_rows(2048, 0.05) == 2048
    assert StepLimits(step_ms=80.0).capped_rows(2048, None) == 2048
