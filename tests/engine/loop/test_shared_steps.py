"""Reads sharing a step (engine/loop/rounds.py) on the real engine process and the default model
(CPU, whose rows do not depend on the step: engine/ops/blas_order.py): a request's tokens and final
state are the same alone, beside others reading and decoding, and from a cached prefix that ends at
any block boundary of its prompt; greedy and seeded."""
import json
from pathlib import Path

import pytest

from protocol import messages as m
from tests.harness import PY, EngineProcess
from tools.checks import preempt_scenarios as sc

CHUNK, BLOCK = 64, 16
CASES = json.loads((Path(__file__).parents[2] / "fixtures/logits_golden.json").read_text())["cases"]
PROMPT = (CASES[3]["ids"] + CASES[0]["ids"])[:100]  # 6 whole blocks and a part
LONG = (CASES[1]["ids"] * 4)[:200]  # a read of four chunks beside A's
SHORT = CASES[2]["ids"][:12]
FLUSH = list(range(1000, 1200))  # tokens no other prompt has: their blocks evict every cached one of a small pool
SAMPLING = {"greedy": {"temperature": 0.0, "seed": 0},
            "seeded": {"temperature": 0.9, "top_p": 0.95, "seed": 1234, "repeat_penalty": 1.1}}
MAX_NEW = 8


def start(tokens: int) -> EngineProcess:
    e = EngineProcess([PY, "-m", "engine", "--serve", "--device", "cpu", "--ctx", str(tokens), "--kv-tokens",
                       str(tokens), "--chunk", str(CHUNK), "--kv-block", str(BLOCK), "--max-running", "8"])
    e.handshake()
    return e


@pytest.fixture(scope="module")
def engine():
    e = start(512)
    yield e
    e.close()


@pytest.fixture(scope="module")
def small():
    """A pool of 13 blocks of 16: the flush request takes every block, evicting what the cache held."""
    e = start(208)
    yield e
    e.close()


@pytest.fixture(scope="module")
def alone(engine):
    return {name: sc.uninterrupted(engine, PROMPT, MAX_NEW, params) for name, params in SAMPLING.items()}


def run(engine, ident: int, prompt, max_new: int, params: dict, reuse: bool) -> m.Done:
    engine.send(m.Gen(max_new, tuple(prompt), {**params, "fp": 1, "reuse": int(reuse)}, ident))
    return engine.read_until(m.Done, ident=ident)


@pytest.mark.parametrize("sampling", SAMPLING)
def test_a_request_beside_reads_and_decoders_gives_its_tokens_alone(engine, alone, sampling):
    params = SAMPLING[sampling]
    engine.send(sc.gen(SHORT, 24, {**params, "seed": 5}, 10))  # decoding while the others read
    seen = engine.read_until(m.Token, ident=10)
    engine.send(sc.gen(LONG, 2, params, 11))
    engine.send(sc.gen(PROMPT, MAX_NEW, params, sc.A))
    engine.send(sc.gen(SHORT, 4, params, 12))
    done: dict[int, m.Done] = {}
    while len(done) < 4:
        seen.append(engine.read())
        if isinstance(seen[-1], m.Done):
            done[seen[-1].id] = seen[-1]
    assert sc.tokens_of(seen, sc.A) == alone[sampling].tokens
    assert done[sc.A].extra["fp"] == alone[sampling].done_fp
    # A and the short read did not wait for the long read ahead of them: they shared its steps
    long_done = next(i for i, x in enumerate(seen) if isinstance(x, m.PromptProgress) and x.id == 11
                     and x.done == x.total)
    a_started = next(i for i, x in enumerate(seen) if isinstance(x, m.PromptProgress) and x.id == sc.A)
    short_token = next(i for i, x in enumerate(seen) if isinstance(x, m.Token) and x.id == 12)
    assert a_started < long_done and short_token < long_done


@pytest.mark.parametrize("sampling", SAMPLING)
def test_a_cached_prefix_ending_at_any_block_gives_the_cold_tokens(small, alone, sampling):
    """(The reference was read by the other engine, its pool laid out otherwise: the same bits.) Every
    other boundary and the last greedy; the first and the last seeded (the sampler meets the same rows)."""
    params = SAMPLING[sampling]
    ends = range(BLOCK, len(PROMPT), BLOCK)
    for cached in [*ends[::2], ends[-1]] if sampling == "greedy" else (ends[0], ends[-1]):
        run(small, 20, FLUSH, 1, params, reuse=False)
        run(small, 21, PROMPT[:cached] + SHORT, 1, params, reuse=False)  # its whole blocks are registered
        got = run(small, sc.A, PROMPT, MAX_NEW, params, reuse=True)
        assert got[-1].extra["cached"] == str(cached)
        assert sc.tokens_of(got, sc.A) == alone[sampling].tokens, cached
        assert got[-1].extra["fp"] == alone[sampling].done_fp, cached


@pytest.mark.parametrize("sampling", SAMPLING)
def test_the_next_turn_reuses_the_answer_and_gives_the_cold_tokens(engine, sampling):
    """An answer's rows are read again once it is done and registered, so that a next turn whose
    prompt is the first one's plus the answer reuses past the first prompt, with a cold read's tokens."""
    params = SAMPLING[sampling]
    answer = sc.tokens_of(run(engine, 30, PROMPT, 40, params, reuse=True), 30)
    assert len(answer) == 40
    run(engine, 31, SHORT, 1, params, reuse=False)  # read in a step beside the answer's: that read is done too
    turn = PROMPT + answer[:39] + SHORT
    warm = run(engine, 32, turn, MAX_NEW, params, reuse=True)
    assert warm[-1].extra["cached"] == str((len(PROMPT) + 39) // BLOCK * BLOCK)  # 128: past the prompt's 96
    cold = run(engine, 33, turn, MAX_NEW, params, reuse=False)
    assert sc.tokens_of(warm, 32) == sc.tokens_of(cold, 33)
    assert warm[-1].extra["fp"] == cold[-1].extra["fp"]
