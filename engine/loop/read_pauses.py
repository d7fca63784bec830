"""A long prompt step's pauses for the decoding requests (engine/loop/rounds.py): between its layers, a decode step
where one more layer would take the decoders' wait for their next token (the time since their last step and a
decode step's own) past `interval_ms`, so that a long read never stops them. The pauses change neither the step's
arithmetic nor its rows.

Layer by layer the step's estimated time says how long the decoders have waited; once that nears the interval
(EARLY of it) the step waits for its layers so far (runner.synchronize: a GPU's launches run ahead of its work) and
the clock decides. The estimate (estimate_ms) is the first read's latest step scaled to this step's rows, or, for a
read's first chunk, the recent prompt steps' time a row: the latest step's time whatever its rows, as it was, let a
long read's first chunk after short reads run unpaused (the decoders waited the whole chunk) and paused a short read
after a long chunk at every layer (its first token a second late on the CPU). An estimate that errs long costs a few
waits for the layers, not a pause too many; one that errs short, a gap that much past the interval."""
from __future__ import annotations

import time
from typing import Callable

from engine.runner.sequence import Sequence

ROW_RATE_DECAY = 0.8  # an older prompt step's weight against each newer one in the time a row
EARLY = 0.7  # the share of interval_ms the estimate must say the decoders have waited before the clock is read
DECODE_DECAY = 0.7  # an older decode step's weight against each newer one in a decode step's time


class ReadPauses:
    def __init__(self, runner, requests, decode_step: Callable[[list[Sequence]], None], interval_ms: float,
                 newcomers: Callable[[float], None] | None = None):
        """newcomers(left_ms): after a pause's decode step, the reads that came meanwhile (engine/loop/rounds.py),
        left_ms the step's own time still to run by its layers so far."""
        self.runner, self.requests, self.decode_step, self.interval_ms = runner, requests, decode_step, interval_ms
        self.newcomers = newcomers
        self.ms_rows = [0.0, 0.0]  # recent prompt steps' own ms and rows, older ones weighing less
        self.decoded_at = 0.0  # when the decoders' latest step ended (clock)
        self.decode_ms = 0.0  # a decode step's time, recent ones weighing more: a token's wait is the step's too
        self.paused_ms = 0.0  # decode steps run in the pauses of the current prompt step
        self.lent_ms = 0.0  # of which newcomers' reads took, by their estimates (engine/loop/rounds.py read_newcomers)
        self.burst_free_at = 0.0  # (clock) from when a burst of short reads may hold the decoders again (may_burst)
        self.clock = time.perf_counter

    def decoded(self, started: float) -> None:
        """The decoders had a step (a round's or a pause's), begun at `started` (clock)."""
        self.decoded_at = self.clock()
        self.decode_ms = DECODE_DECAY * self.decode_ms + (1 - DECODE_DECAY) * (self.decoded_at - started) * 1000

    def decoding_began(self) -> None:
        """Requests decode again after reads that nobody decoding waited for: their wait for the next token starts at
        their first tokens, not at the last decode step before those reads."""
        self.decoded_at = self.clock()

    def reads_done(self) -> None:
        """A round's reads are done and the decoders' step comes: held past the interval (by a burst of short reads),
        they get as long at their own pace before the next burst may hold them (a stream of short reads that never
        ends leaves them half the time at least)."""
        now = self.clock()
        held_ms = (now - self.decoded_at) * 1000 - self.interval_ms
        self.burst_free_at = max(self.burst_free_at, now + held_ms / 1000)

    def may_burst(self) -> bool:
        """Whether a burst of short reads may hold the decoders past the interval now (reads_done)."""
        return self.clock() >= self.burst_free_at

    def observe(self, rows: int, ms: float) -> None:
        """A prompt step of `rows` rows took `ms` of its own (its pauses aside)."""
        self.ms_rows = [self.ms_rows[0] * ROW_RATE_DECAY + ms, self.ms_rows[1] * ROW_RATE_DECAY + rows]

    def estimate_ms(self, seq: Sequence, rows: int) -> float | None:
        """A prompt step of `rows` rows whose first read is seq: its own time, by seq's latest step scaled to the
        rows (the same depth of its prompt), else at the recent steps' time a row (which a short step's overhead
        inflates: it errs long); None before any prompt step."""
        if seq.row_ms is not None:
            return seq.row_ms * rows
        ms, seen = self.ms_rows
        return ms * rows / seen if seen else None

    def layers_ms(self) -> float:
        """How long the layers between two decode steps may run: the interval less a decode step's own time (the
        decoders' next token comes after it too), but half the interval at least (where a decode step takes as long
        as the interval, a CPU's, the read keeps half the time)."""
        return max(self.interval_ms - self.decode_ms, self.interval_ms / 2)

    def plan(self, seq: Sequence, rows: int, wait_ms: float = 0.0) -> Callable[[int], None] | None:
        """The step's pause between layers (called after each; None: the step runs straight through), seq its
        first read and `rows` its rows: a decode step where one more layer would take the decoders' wait past
        layers_ms (the layer's time as measured so far in this step), once half the interval has gone at least.
        wait_ms, past the interval: the decoders may wait that long for this step (a burst of short reads': the
        step runs through where its estimate ends within it)."""
        self.paused_ms = self.lent_ms = 0.0
        estimate = self.estimate_ms(seq, rows)
        if not (self.interval_ms and estimate and self.requests.any_decoding()):
            return None
        per_layer, began = estimate / self.runner.layers, self.clock()
        waited = (began - self.decoded_at) * 1000  # by the estimate, at the layer in hand
        if wait_ms > self.interval_ms and waited + estimate <= wait_ms:
            return None  # (past it, the interval's pauses: the first comes at once)
        if waited + estimate < EARLY * self.layers_ms():
            return None  # the step ends before the decoders have waited long

        def pause(layer: int) -> None:
            nonlocal waited
            waited += per_layer
            if waited + per_layer < EARLY * self.layers_ms():
                return
            decoding = self.requests.decoding()
            if not decoding:
                return
            self.runner.synchronize()  # the layers so far are done: the clock is the step's own time
            now = self.clock()
            since = (now - self.decoded_at) * 1000
            layer_ms = ((now - began) * 1000 - self.paused_ms) / (layer + 1)  # as measured in this step
            if since < self.interval_ms / 2 or since + layer_ms <= self.layers_ms():
                return
            self.decode_step(decoding)
            self.runner.synchronize()
            self.decoded(now)
            if self.newcomers is not None:
                self.newcomers(layer_ms * (self.runner.layers - layer - 1))
            after = self.clock()
            self.paused_ms += (after - now) * 1000
            waited = (after - self.decoded_at) * 1000  # (a newcomer's read since the decoders' step)

        return pause
