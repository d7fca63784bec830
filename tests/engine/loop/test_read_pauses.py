"""A long prompt step's pauses for the decoding requests (engine/loop/read_pauses.py): a decode step whenever they
have waited the interval, the clock read once the step's estimated time says the wait nears it. The estimate is the
first read's latest step scaled to this step's rows, or, for a read's first chunk, the recent prompt steps' time a
row. The old estimate (the latest step's time, whatever its rows) went wrong both ways on the CPU's traces: a long
read's first chunk after short reads ran unpaused (the decoders waited 366-537 ms where the interval is 50), and a
short read after a long chunk paused at every layer (38 rows in 1.2-1.4 s, 1.0-1.2 s of it decode steps)."""
from __future__ import annotations

from types import SimpleNamespace

from engine.loop.read_pauses import ReadPauses
from engine.runner.sampler import Sampler, SamplingParams
from engine.runner.sequence import Sequence

LAYERS, INTERVAL = 30, 50.0


class Step:
    """A prompt step run on a fake clock: each layer takes `layer_ms`, each decode step `decode_ms`; records the
    layers after which the decoders had a step, and how often the step waited for its layers (synchronize)."""

    def __init__(self, decoding: bool = True, decode_ms: float = 0.0):
        self.now, self.decode_ms, self.paused, self.waits = 0.0, decode_ms, [], 0
        runner = SimpleNamespace(layers=LAYERS, synchronize=self.synchronize)
        requests = SimpleNamespace(any_decoding=lambda: decoding, decoding=lambda: ["a decoder"] if decoding else [])
        self.pauses = ReadPauses(runner, requests, self.decode, INTERVAL)
        self.pauses.clock = lambda: self.now / 1000

    def synchronize(self) -> None:
        self.waits += 1

    def decode(self, decoding) -> None:
        self.paused.append(self.layer)
        self.now += self.decode_ms

    def run(self, seq: Sequence, rows: int, layer_ms: float) -> list[int]:
        self.pauses.decoded(self.pauses.clock())  # a round's decode step (of no time) just ended
        pause = self.pauses.plan(seq, rows)
        self.paused, self.waits = [], 0
        for self.layer in range(LAYERS):
            self.now += layer_ms
            if pause is not None:
                pause(self.layer)
        return self.paused


def read(prompt_tokens: int = 3000) -> Sequence:
    prompt = tuple(range(prompt_tokens))
    return Sequence(id=1, prompt=prompt, max_new=4, sampler=Sampler(SamplingParams(), prompt), stop_ids=frozenset())


WITHIN_50_MS = list(range(2, 30, 3))  # layers of 12.6 ms: a fourth would take the wait past 50 ms


def test_the_decoders_get_a_step_each_interval_whatever_the_estimate_says_above_it():
    seq = read()
    for estimate_ms in (375.0, 1500.0):  # right, and four times too long
        step = Step()
        seq.row_ms = estimate_ms / 256
        assert step.run(seq, 256, layer_ms=12.6) == WITHIN_50_MS
    assert step.waits > len(WITHIN_50_MS)  # the long estimate's cost: waits for the layers, not more pauses


def test_an_estimate_that_errs_short_leaves_that_much_of_a_gap():
    seq, step = read(), Step()
    seq.row_ms = 375.0 / 4 / 256  # a quarter of the step's 375 ms
    assert step.run(seq, 256, layer_ms=12.6) == [10, 21]  # ~140 ms apart


def test_a_first_chunk_is_estimated_at_the_recent_steps_time_a_row():
    seq, step = read(), Step()
    assert step.pauses.estimate_ms(seq, 256) is None and step.run(seq, 256, 25.2) == []  # nothing measured
    step.pauses.observe(37, 155.0)  # a short read's step: ~4.2 ms a row
    assert abs(step.pauses.estimate_ms(seq, 256) - 155 * 256 / 37) < 1e-9
    assert step.run(seq, 256, layer_ms=25.2) == list(range(LAYERS))  # a second layer would pass 50 ms


def test_a_short_read_after_a_long_chunk_is_estimated_for_its_own_rows():
    """Estimated at the long chunk's time (2 s), a short read paused after every layer, its first token a second
    late on the CPU; at the chunk's time a row, 38 rows take ~300 ms there (a pause within every 50), and a GPU's
    ~1.4 ms (straight through, no wait for its layers)."""
    newcomer, cpu = read(38), Step()
    cpu.pauses.observe(256, 2000.0)
    assert abs(cpu.pauses.estimate_ms(newcomer, 38) - 2000 * 38 / 256) < 1e-9
    assert cpu.run(newcomer, 38, layer_ms=10.1) == list(range(3, LAYERS, 4))
    gpu = Step()
    gpu.pauses.observe(4096, 150.0)
    assert gpu.run(newcomer, 38, layer_ms=1.4 / LAYERS) == [] and gpu.waits == 0


def test_a_decode_steps_own_time_counts_in_the_decoders_wait():
    """A decoder's next token comes after the prompt layers and the decode step: with steps of 20 ms the pauses come
    within ~30 ms of layers (once the steps' time is learnt), so that a token follows the one before within 50."""
    seq, step = read(), Step(decode_ms=20.0)
    seq.row_ms = 375.0 / 256
    ends = []
    step.pauses.decode_step = lambda decoding: (step.decode(decoding), ends.append(step.now))
    step.run(seq, 256, layer_ms=12.6)
    gaps = [b - a for a, b in zip(ends, ends[1:])]
    assert gaps and max(gaps[2:]) <= 50.0 and abs(step.pauses.decode_ms - 20.0) < 2.0
    assert abs(step.pauses.paused_ms - 20.0 * len(ends)) < 1e-9


def test_where_a_decode_step_takes_the_interval_the_read_keeps_half_the_time():
    """A CPU's decode step of two rows takes ~50 ms: the layers between two of them still run half the interval."""
    seq, step = read(), Step(decode_ms=60.0)
    step.pauses.decode_ms = 60.0
    seq.row_ms = 375.0 / 256
    assert step.run(seq, 256, layer_ms=12.6) == list(range(1, LAYERS, 2))  # 25.2 ms of layers, then 60 of decode


def test_nobody_decoding_means_no_pauses():
    seq, step = read(), Step(decoding=False)
    seq.row_ms = 375.0 / 256
    assert step.pauses.plan(seq, 256) is None
