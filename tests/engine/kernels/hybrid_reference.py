"""What the GPU path's hybrid tests share: the fixtures' goldens (tests/fixtures/hybrid), a prompt read as the engine
reads it, and the check of a runner's logits against transformers' (fp16 activations: ~0.1% of the logits'
spread, more where fp16 flips a near-tied expert choice, as llama.cpp's do)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from engine.kvcache.recurrent import SequenceState

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures/hybrid"
GOLDEN = json.loads((FIXTURES / "hybrid_golden.json").read_text())


def read(runner, ids, table, cuts=()) -> tuple[np.ndarray, SequenceState]:
    """ids read from position 0 in pieces ending at `cuts` (then at its end), each from the state's mark as the
    engine reads -> (the last logits on the host, the state)."""
    state = SequenceState.fresh(runner.recurrent)
    logits = None
    for end in [*cuts, len(ids)]:
        pos = state.rewind()
        logits = runner.forward(np.asarray(ids[pos:end]), pos, table, end == len(ids), state=state)
        state.read(pos, end - pos)
    return runner.backend.to_host(logits), state


def error(got, want) -> float:
    """The largest distance, in the reference logits' spread."""
    want = np.asarray(want)
    return float(np.abs(np.asarray(got) - want).max() / (want.max() - want.min()))


def check_against_transformers(runner, spec: dict, decoded: int | None = None) -> None:
    """Each prompt's last logits read in chunks within 1% and its first greedy token the same; the longest prompt
    fed a token at a time as decode rows (to `decoded`, else its end): each position's probes within 0.5% at the
    median, at most 3% of positions past 1% (an expert choice fp16 flips), none past 25%."""
    for case in spec["cases"]:
        logits, _ = read(runner, case["ids"], list(range(runner.pool.blocks_for(len(case["ids"]) + 1))))
        assert error(logits[case["probes"]], case["probe_logits"]) < 0.01
        assert int(np.argmax(logits)) == case["greedy"][0]
    case = next(c for c in spec["cases"] if "probe_logits_every_position" in c)
    ids, table = case["ids"], list(range(runner.pool.blocks_for(len(case["ids"]) + 1)))
    _, state = read(runner, ids[:1], table)
    errors = []
    for pos in range(1, decoded or len(ids)):
        row = runner.backend.to_host(runner.decode_logits([ids[pos]], [table], [pos], [state])[0])
        state.decoded()
        errors.append(error(row[case["probes"]], case["probe_logits_every_position"][pos]))
    assert np.median(errors) < 0.005 and np.mean(np.asarray(errors) > 0.01) < 0.03 and max(errors) < 0.25, errors


def check_a_cut_read(runner) -> SequenceState:
    """150 random ids read whole and cut at 100 (read again from 64, its mark): the same logits and state, bit for
    bit. Returns the cut read's state."""
    ids = np.random.default_rng(4).integers(0, runner.vocab_size, 150)
    table = list(range(runner.pool.blocks_for(160)))
    whole, whole_state = read(runner, ids, table)
    cut, cut_state = read(runner, ids, table, cuts=(100,))
    assert np.array_equal(cut, whole) and cut_state.now.digest() == whole_state.now.digest()
    assert cut_state.mark.digest() == whole_state.mark.digest()
    return cut_state
