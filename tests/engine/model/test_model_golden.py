"""Golden logits against an independent fp32 reference (transformers on the same GGUF; see
tools/fixtures/make_logits_fixture.py), chunking invariants, and exact greedy text."""
import json
from pathlib import Path

import numpy as np
import pytest

from engine.kvcache.kv import KVCache

FIXTURE = json.loads((Path(__file__).parents[2] / "fixtures/logits_golden.json").read_text())
CASES = FIXTURE["cases"]
LOGIT_TOLERANCE = 2e-3  # absolute; measured agreement is ~1e-4 (float32, different summation order)


@pytest.mark.parametrize("case", CASES, ids=[c["text"][:30] for c in CASES])
def test_top_logits_match_the_reference(loaded, case):
    ids = np.asarray(case["ids"])
    for top in case["top"]:
        logits = loaded.logits_after(ids[: top["pos"] + 1], chunk=64)
        ours = logits[top["ids"]]
        assert np.max(np.abs(ours - np.asarray(top["logits"]))) < LOGIT_TOLERANCE, (top["pos"], ours)
        assert int(np.argmax(logits)) == top["ids"][0]


def greedy(loaded, ids, n: int, chunk: int = 64) -> list[int]:
    kv = KVCache(loaded.cfg, 1024, loaded.backend)
    logits = loaded.model.prefill(np.asarray(ids), kv, chunk)
    out = []
    for _ in range(n):
        out.append(int(np.argmax(logits)))
        if out[-1] == 2:
            break
        logits = loaded.model.forward(np.asarray(out[-1:]), len(ids) + len(out) - 1, kv, want_logits=True)
    return out


@pytest.mark.parametrize("case", CASES, ids=[c["text"][:30] for c in CASES])
def test_greedy_continuation_matches_the_reference(loaded, case):
    assert greedy(loaded, case["ids"], len(case["greedy"])) == case["greedy"]


def test_capital_of_france_is_paris(loaded, tokenizer):
    ids = CASES[0]["ids"]
    assert tokenizer.decode(greedy(loaded, ids, 16)) == "The capital of France is Paris."


@pytest.fixture(scope="module")
def long_case_logits(loaded):
    """The longest case's last logits read in chunks of 64, computed once for the cases below."""
    return loaded.logits_after(np.asarray(CASES[3]["ids"]), 64)


def test_same_chunk_size_gives_bit_identical_logits(loaded, long_case_logits):
    assert np.array_equal(loaded.logits_after(np.asarray(CASES[3]["ids"]), 64), long_case_logits)


@pytest.mark.parametrize("chunk", [1, 17])
def test_other_chunk_sizes_agree_within_tolerance(loaded, long_case_logits, chunk):
    ids = np.asarray(CASES[3]["ids"][:100] if chunk == 1 else CASES[3]["ids"])
    a = loaded.logits_after(ids, 64) if chunk == 1 else long_case_logits
    assert np.max(np.abs(a - loaded.logits_after(ids, chunk))) < 1e-3


def test_attention_tiles_over_long_contexts_agree(loaded, monkeypatch):
    """More keys than one tile: the online softmax over tiles equals one big tile."""
    import engine.ops.backend as backend_module

    ids = np.asarray((CASES[3]["ids"] * 2)[:600])  # the second chunk's queries see 600 keys: 5 tiles of 128
    one_tile = loaded.logits_after(ids, 512, ctx=1024)
    monkeypatch.setattr(backend_module, "KEY_TILE", 128)
    tiled = loaded.logits_after(ids, 512, ctx=1024)
    assert np.max(np.abs(one_tile - tiled)) < 1e-3
