"""The hybrid families against independent references: tiny random models made with transformers,
converted by llama.cpp's converter (tools/fixtures/make_hybrid_fixture.py says how), and the logits and
greedy tokens transformers computed from them (tests/fixtures/hybrid/hybrid_golden.json), and llama.cpp's
CPU build's logits on the same files (tools/fixtures/llama_cpp_reference.py). The engine
reads each prompt as it does a request's (the chunked delta rule from position 0) and decodes its
continuation (the recurrent one); both forms meet the reference at every position."""
import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from engine.kvcache.recurrent import SequenceState
from engine.model.weights import load_model
from engine.ops.backend import cpu_backend
from engine.runner.runner import ModelRunner

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures/hybrid"
GOLDEN = json.loads((FIXTURES / "hybrid_golden.json").read_text())
TOL = dict(rtol=2e-4, atol=2e-4)  # float32 both, sums in other orders


@pytest.fixture(scope="module", params=sorted(GOLDEN["models"]))
def family(request):
    spec = GOLDEN["models"][request.param]
    path = FIXTURES / spec["file"]
    assert hashlib.sha256(path.read_bytes()).hexdigest() == spec["sha256"], "the fixture's file changed"
    backend = cpu_backend()
    cfg, weights, _ = load_model(str(path), backend)
    return spec, ModelRunner(cfg, weights, backend, ctx=512, chunk=64, eos_ids=frozenset(), max_running=2)


def read(runner, ids, room: int = 16) -> tuple[np.ndarray, SequenceState, list[int]]:
    """ids read in chunks from position 0 (the last logits), as a request's prompt, in blocks for `room`
    positions more."""
    state, table = SequenceState.fresh(runner.recurrent), list(range(runner.pool.blocks_for(len(ids) + room)))
    pos = 0
    while pos < len(ids):
        end = min(len(ids), pos + 64)
        logits = runner.forward(np.asarray(ids[pos:end]), pos, table, end == len(ids), state=state)
        state.read(pos, end - pos)
        pos = end
    return np.array(logits), state, table


def test_the_prompt_s_last_logits_match_transformers(family):
    spec, runner = family
    for case in spec["cases"]:
        logits, _, _ = read(runner, case["ids"])
        top = [i for i, _ in case["top"]]
        np.testing.assert_allclose(logits[top], [v for _, v in case["top"]], **TOL)
        np.testing.assert_allclose(logits[case["probes"]], case["probe_logits"], **TOL)
        assert int(np.argmax(logits[: len(logits)])) == case["greedy"][0]


def test_the_prompt_s_last_logits_match_llama_cpp_too(family):
    """llama.cpp's CPU build on the same files (tools/fixtures/llama_cpp_reference.py), a second reference. Its F16
    products round their inputs to fp16, which puts it up to ~1e-3 from transformers here: the bound is that
    distance's few times over, not the float32 one."""
    spec, runner = family
    for case in spec["cases"]:
        logits, _, _ = read(runner, case["ids"])
        np.testing.assert_allclose(logits[case["probes"]], case["llama_cpp"]["probe_logits"], rtol=0, atol=4e-3)


def test_every_position_matches_transformers_read_and_decoded(family):
    """Each prefix of the longest prompt read as a prompt (the chunked form), and the whole prompt fed
    one token at a time as decode rows (the recurrent form)."""
    spec, runner = family
    case = next(c for c in spec["cases"] if "probe_logits_every_position" in c)
    ids, want = case["ids"], np.asarray(case["probe_logits_every_position"])
    for n in (1, 2, 63, 64, 65, 100, 128, 129, len(ids)):
        logits, _, _ = read(runner, ids[:n])
        np.testing.assert_allclose(logits[case["probes"]], want[n - 1], **TOL, err_msg=f"read of {n}")
    _, state, table = read(runner, ids[:1], room=len(ids))
    for pos in range(1, len(ids)):
        logits = np.array(runner.decode_logits([ids[pos]], [table], [pos], [state])[0])
        state.decoded()
        np.testing.assert_allclose(logits[case["probes"]], want[pos], **TOL, err_msg=f"decode row {pos}")


def test_greedy_continuations_match_transformers(family):
    spec, runner = family
    for case in spec["cases"]:
        logits, state, table = read(runner, case["ids"])
        tokens = [int(np.argmax(logits))]
        while len(tokens) < len(case["greedy"]):
            logits = np.array(runner.decode_logits([tokens[-1]], [table], [len(case["ids"]) + len(tokens) - 1],
                                                   [state])[0])
            state.decoded()
            tokens.append(int(np.argmax(logits)))
        assert tokens == case["greedy"]
