"""What bounds a round's steps (engine/loop/rounds.py), from the command line (engine/cli.py, --decode-interval-ms,
--burst-ms, --step-tokens, --step-ms): how often the decoders get a step while reads run (a long read's, a burst of
short ones'), how many prompt rows a step takes, and how long a prompt step may take while others decode."""
from __future__ import annotations

from dataclasses import dataclass

STEP_ROWS_FLOOR = 256  # the fewest rows step_ms leaves a prompt step (a smaller GEMM wastes the tensor cores)
STEP_ROWS_ALIGN = 128  # a capped step's rows, a multiple of this (the GEMMs' tiles)


@dataclass(frozen=True)
class StepLimits:
    interval_ms: float = 0.0  # the decoders' step about this often while a read runs (read_pauses.py; 0: each chunk)
    step_tokens: int | None = None  # prompt rows a step may take from several reads (None: step_budget's default)
    step_ms: float = 0.0  # while others decode, the rows of a prompt step, by its estimated time (0: no bound)
    burst_ms: float = 0.0  # how long the decoders' next token may wait for short reads' first tokens (0: interval_ms)

    def wait_ms(self, short: bool) -> float:
        """How long the decoders may wait for their next step while prompt steps run: interval_ms, or burst_ms where
        the steps are short reads' (each a chunk or less past its cached prefix: a burst of newcomers' first tokens)."""
        return max(self.burst_ms, self.interval_ms) if short else self.interval_ms

    def capped_rows(self, rows: int, ms_a_row: float | None) -> int:
        """A prompt step's `rows`, fewer where at `ms_a_row` (its estimate) it would take past step_ms: a request that
        comes meanwhile waits for the step in progress (its first token after it), whose pauses for the decoders
        already make it longer. Aligned to STEP_ROWS_ALIGN, STEP_ROWS_FLOOR at least."""
        if not self.step_ms or not ms_a_row:
            return rows
        fit = int(self.step_ms / ms_a_row) // STEP_ROWS_ALIGN * STEP_ROWS_ALIGN
        return min(rows, max(fit, STEP_ROWS_FLOOR))
