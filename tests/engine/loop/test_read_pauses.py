"""The pauses a prompt step makes for the decoding requests (engine/loop/rounds.py): planned from the step's
estimated time, which is the first read's latest step scaled to this step's rows, or, for a read's first chunk,
the recent prompt steps' time a row. A long read's first chunk after short reads used to be estimated at the short
steps' time: it ran unpaused and the decoders waited the whole chunk (on the CPU, 366-537 ms between tokens where
the interval is 50; on an H200 the decoders' gap p99 85-100 ms, max 122-233)."""
from __future__ import annotations

from types import SimpleNamespace

from engine.loop.rounds import Rounds
from engine.runner.sequence import Sequence
from engine.runner.sampler import Sampler, SamplingParams

LAYERS = 30


def rounds(decoding: bool = True) -> Rounds:
    runner = SimpleNamespace(chunk=256, row_cost=None, layers=LAYERS)
    requests = SimpleNamespace(any_decoding=lambda: decoding)
    return Rounds(runner, requests, None, None, None, lambda line: None, None, lambda line: None, interval_ms=50.0)


def read(prompt_tokens: int = 3000) -> Sequence:
    prompt = tuple(range(prompt_tokens))
    return Sequence(id=1, prompt=prompt, max_new=4, sampler=Sampler(SamplingParams(), prompt), stop_ids=frozenset())


def pause_layers(r: Rounds, seq: Sequence, rows: int) -> list[int]:
    """The layers after which the step pauses (its decode steps recorded, not run)."""
    paused = []
    r.requests.decoding = lambda: ["a decoder"]
    r.decode_step = lambda decoding: paused.append(layer)
    r.runner.synchronize = lambda: None
    pause = r.pauses(seq, rows)
    for layer in range(LAYERS):
        if pause is not None:
            pause(layer)
    return paused


def test_a_first_chunk_after_short_reads_is_estimated_at_their_time_a_row():
    r, seq = rounds(), read()
    assert r.estimate_ms(seq, 256) is None and pause_layers(r, seq, 256) == []  # nothing measured: straight through
    r.prompt_ms_rows = [155.0, 37.0]  # a 37-row step of 155 ms: ~4.2 ms a row
    assert abs(r.estimate_ms(seq, 256) - 155 * 256 / 37) < 1e-9
    assert pause_layers(r, seq, 256) == list(range(LAYERS))  # ~1.07 s: a pause after every layer
    assert pause_layers(r, seq, 8) == []  # ~34 ms, under the interval: straight through
    assert pause_layers(r, seq, 16) == [21]  # ~67 ms: one pause, after 22 of its 30 layers


def test_a_reads_next_chunk_is_estimated_by_its_own_latest_step():
    r, seq = rounds(), read()
    r.prompt_ms_rows = [155.0, 37.0]
    seq.chunk_ms, seq.chunk_rows = 500.0, 256  # its first chunk took 500 ms without its pauses
    assert r.estimate_ms(seq, 128) == 250.0
    assert pause_layers(r, seq, 256) == list(range(2, LAYERS, 3))  # every 3 of 30 layers: ~50 ms


def test_nobody_decoding_means_no_pauses():
    r, seq = rounds(decoding=False), read()
    r.prompt_ms_rows = [155.0, 37.0]
    assert r.pauses(seq, 256) is None


def test_a_short_read_beside_a_long_one_is_estimated_for_its_own_rows():
    """A newcomer's short read in a step of its own after a long read's chunk: before, estimated at that chunk's
    time (2 s), it paused after every layer and its first token waited ~1 s for decode steps (the CPU's trace: 38
    rows in 1.2-1.4 s, 1.0-1.2 s of it pauses); now at the recent steps' time a row."""
    r, newcomer = rounds(), read(38)
    r.prompt_ms_rows = [2000.0, 256.0]  # the long read's latest chunk: 256 rows in 2 s
    assert abs(r.estimate_ms(newcomer, 38) - 2000 * 38 / 256) < 1e-9
    assert pause_layers(r, newcomer, 38) == list(range(4, LAYERS, 5))  # ~297 ms: every 5 layers, not every one
