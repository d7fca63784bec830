"""What one more row costs a decode step, measured on the steps themselves: speculative decoding's pace
(engine/runner/draft_pace.py, through engine/loop/decode_steps.py) weighs a draft's expected tokens against it.

A step of r rows (its draws, its forward, the host's work between) takes about t(r) = base + slope * r. RowCost
fits that line to the recent steps (least squares, older steps weighing less) once their row counts differ enough
to show a slope (several requests, or drafts); until then the backend's prior stands. A CPU's rows each pass over
the weights: a row costs 0.8-0.97 of a one-row step (the Qwen2.5-Coder 0.5B and 1.5B fixtures on 2 cores). A GPU's
share one pass: the 8B shape's Q4_K_M decode on the H200 takes 2.62 ms a step for one row and 4.35 for four, a row
0.22 of the one-row step; a small model's GPU step is mostly the host's work, which the line takes in.

The figure a pace takes is a row's cost against a request's share of the step, requests * slope / t(requests):
a draft of k rows pays when it brings more than k times that in tokens, the step being shared by every request
in it."""
from __future__ import annotations

DECAY = 0.97  # an older step's weight against each newer one (the last ~30 count)
MIN_SPREAD = 0.2  # the row counts' weighted variance below which no slope is fitted (the prior stands)
FLOOR, CEILING = 0.01, 2.0  # the figure's bounds: a fit on noisy steps never says a row is free or absurd
PRIORS = {"cpu": 0.75, "gpu": 0.2}  # a row against a one-request step, by backend, until measured
OUTLIER = 5.0  # a step this many times the expected time is not counted (a graph's capture, a pause)


class RowCost:
    def __init__(self, prior: float, fixed: float | None = None):
        self.prior = prior  # a row's cost against a one-request step, until the steps show a slope
        self.fixed = fixed  # a cost given by the user (--draft-row-cost): no measurement
        self.w = self.r = self.rr = self.t = self.rt = 0.0  # the decayed sums of 1, rows, rows^2, s, rows * s

    def observe(self, rows: int, seconds: float) -> None:
        """A decode step of `rows` rows took `seconds`."""
        expected = self.step_seconds(rows)
        if expected is not None and seconds > OUTLIER * expected:
            return
        self.w = self.w * DECAY + 1.0
        self.r = self.r * DECAY + rows
        self.rr = self.rr * DECAY + rows * rows
        self.t = self.t * DECAY + seconds
        self.rt = self.rt * DECAY + rows * seconds

    def line(self) -> tuple[float, float] | None:
        """(base, slope) in seconds, or None while the row counts are too alike to show a slope."""
        if self.w == 0.0:
            return None
        mean_r, mean_t = self.r / self.w, self.t / self.w
        spread = self.rr / self.w - mean_r * mean_r
        if spread < MIN_SPREAD:
            return None
        slope = (self.rt / self.w - mean_r * mean_t) / spread
        return mean_t - slope * mean_r, slope

    def step_seconds(self, rows: int) -> float | None:
        """A step of `rows` rows' time as measured (the line, else the mean of the steps seen; None before any)."""
        fit = self.line()
        if fit is not None:
            return max(fit[0] + fit[1] * rows, 1e-6)
        return self.t / self.w if self.w else None

    def fraction(self, requests: int) -> float:
        """One more row's cost against one request's share of a step of `requests` rows."""
        if self.fixed is not None:
            return self.fixed
        fit = self.line()
        if fit is None:
            return self.prior
        base, slope = fit
        whole = base + slope * requests
        if whole <= 0.0:
            return self.prior
        return min(CEILING, max(FLOOR, requests * slope / whole))

    def draft_fraction(self, requests: int, forward_seconds: float | None, size_ratio: float) -> float:
        """A draft model's drafted token's cost: its row's (fraction) and a forward of the draft model against the
        step (forward_seconds as measured; until then size_ratio, the draft's file against the model's: on a CPU,
        where a row costs most of a step, a draft model's drafts then never pay and never start). A given cost
        stands alone."""
        row = self.fraction(requests)
        if self.fixed is not None:
            return row
        step = self.step_seconds(requests)
        return row + (forward_seconds / step if step and forward_seconds else size_ratio)
