"""A continuation after an engine restart (GEN drawn=k: the prompt then the k tokens the request had; engine/runner/
sequence.py replay) on the real engine process and the default model: the prompt is read, the k tokens go through as
the decode rows they were (not drawn again, not written out), and the request goes on with the tokens and the final
state (its rows' fingerprint) it had uninterrupted, greedy or seeded."""
import pytest

from protocol import messages as m
from tests.harness import PY, EngineProcess
from tools.checks import preempt_scenarios as sc

PROMPT = tuple(range(200, 200 + 90))
MAX_NEW = 24
SAMPLING = {"greedy": {"temperature": 0.0, "seed": 0},
            "seeded": {"temperature": 0.9, "top_p": 0.95, "seed": 77, "repeat_penalty": 1.1}}


@pytest.fixture(scope="module")
def engine():
    e = EngineProcess([PY, "-m", "engine", "--serve", "--device", "cpu", "--ctx", "1024", "--chunk", "64"])
    e.handshake()
    yield e
    e.close()


@pytest.mark.parametrize("sampling", SAMPLING)
def test_a_continuation_has_the_rows_and_tokens_of_the_uninterrupted_request(engine, sampling):
    params = {**SAMPLING[sampling], "fp": 1, "reuse": 0}
    engine.send(m.Gen(MAX_NEW, PROMPT, params, 1))
    whole = engine.read_until(m.Done, ident=1)
    tokens = sc.tokens_of(whole, 1)
    assert len(tokens) == MAX_NEW
    for k in (1,) if sampling == "greedy" else (9,):  # (the first token after the prompt; one deep in the answer)
        engine.send(m.Gen(MAX_NEW - k, PROMPT + tuple(tokens[:k]), {**params, "drawn": k}, 2))
        rest = engine.read_until(m.Done, ident=2)
        assert sc.tokens_of(rest, 2) == tokens[k:]  # the k tokens not written again
        assert rest[-1].extra["fp"] == whole[-1].extra["fp"]  # every row as it was, the k tokens' decode rows too
        done = rest[-1]
        assert (done.generated, done.prompt_tokens) == (MAX_NEW - k, len(PROMPT) + k)
        reads = [x for x in rest if isinstance(x, m.PromptProgress)]
        assert reads and all(x.total == len(PROMPT) for x in reads)  # the prompt read; the k tokens decoded
