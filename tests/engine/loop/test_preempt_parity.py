"""Park/resume parity on the real engine and the default model (CPU): tokens AND state
fingerprints of a parked-then-resumed request equal those of the uninterrupted one."""
import json
from pathlib import Path

import pytest

from protocol import messages as m
from tests.harness import PY, EngineProcess
from tools.checks import preempt_scenarios as sc

CHUNK = 32
CASES = json.loads((Path(__file__).parents[2] / "fixtures/logits_golden.json").read_text())["cases"]
PROMPT = CASES[3]["ids"][:166] + CASES[0]["ids"]  # 203 tokens: 6 full chunks and a partial one
INTERIM = CASES[1]["ids"]
SAMPLING = {"greedy": {"temperature": 0.0, "seed": 0},  # a seed pins the RNG state the fingerprint hashes
            "seeded": {"temperature": 0.9, "top_p": 0.95, "seed": 1234, "repeat_penalty": 1.1}}
MAX_NEW = 8


@pytest.fixture(scope="module")
def engine():
    e = EngineProcess([PY, "-m", "engine", "--serve", "--device", "cpu", "--ctx", "1024", "--chunk", str(CHUNK),
                       "--prefill-preempt", "--prefill-preempt-min-tokens", "0"])
    assert "preempt" in e.handshake().caps
    yield e
    e.close()


@pytest.fixture(scope="module")
def reference(engine):
    return {name: sc.uninterrupted(engine, PROMPT, MAX_NEW, params) for name, params in SAMPLING.items()}


# greedy: every boundary with two interims and every interim at two boundaries; seeded, each boundary with
# one interim (the sampler's state is saved and restored the same way whatever ran in between)
CASES_RUN = ([("greedy", 1, 0), ("greedy", 1, 32), ("greedy", 2, 0), ("greedy", 2, 1), ("greedy", 5, 1),
              ("greedy", 5, 32)] + [("seeded", 1, 0), ("seeded", 2, 1), ("seeded", 5, 32)])


@pytest.mark.parametrize("sampling, boundary, interim_tokens", CASES_RUN)
def test_parked_then_resumed_equals_uninterrupted(engine, reference, sampling, boundary, interim_tokens):
    out = sc.parked(engine, PROMPT, MAX_NEW, SAMPLING[sampling], CHUNK, [boundary], INTERIM, interim_tokens)
    assert out.parks == [boundary * CHUNK]
    assert out.park_fps == out.resume_fps  # the restore put back exactly what was saved
    assert out.tokens == reference[sampling].tokens
    assert out.done_fp == reference[sampling].done_fp


@pytest.mark.parametrize("sampling", SAMPLING)
def test_pure_restore_with_nothing_in_between(engine, reference, sampling):
    out = sc.parked(engine, PROMPT, MAX_NEW, SAMPLING[sampling], CHUNK, [3])
    assert (out.tokens, out.done_fp) == (reference[sampling].tokens, reference[sampling].done_fp)


@pytest.mark.parametrize("sampling", SAMPLING)
def test_three_consecutive_parks(engine, reference, sampling):
    out = sc.parked(engine, PROMPT, MAX_NEW, SAMPLING[sampling], CHUNK, [1, 2, 3], INTERIM, 1)
    assert out.parks == [32, 64, 96] and out.park_fps == out.resume_fps
    assert (out.tokens, out.done_fp) == (reference[sampling].tokens, reference[sampling].done_fp)


def test_cancel_while_parked_then_serving_goes_on(engine, reference):
    done = sc.cancel_while_parked(engine, PROMPT, SAMPLING["greedy"], CHUNK)
    assert done.finish == "cancel" and done.generated == 0
    engine.send(m.Resume(sc.A))  # the snapshot is gone
    assert "no parked request" in engine.read_until(m.Err)[-1].message
    out = sc.uninterrupted(engine, PROMPT, MAX_NEW, SAMPLING["greedy"])
    assert out.tokens == reference["greedy"].tokens


def test_decode_never_yields(engine, reference):
    out, park_lines = sc.yield_during_decode(engine, PROMPT, MAX_NEW, SAMPLING["greedy"])
    assert park_lines == [] and out.tokens == reference["greedy"].tokens


def test_the_final_partial_chunk_is_not_a_park_point(engine):
    engine.send(sc.gen(PROMPT[:40], 2, {}, sc.A))  # chunks [0, 32) and [32, 40)
    engine.read_until(m.PromptProgress, ident=sc.A)
    engine.send(m.Yield())  # offered during the last chunk: the read ends, nothing parks
    got = engine.read_until(m.Done, ident=sc.A)
    assert not [x for x in got if isinstance(x, m.Suspended)]
