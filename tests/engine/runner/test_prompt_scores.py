"""Prompt log-probabilities (engine/runner/prompt_scores.py): each prompt row scored once, the first time it is read,
however the reads go (a hybrid model's read starts again at its recurrent state's mark, before rows already
scored); and on a real hybrid engine, every prompt token's log-probability the one its prefix's logits give."""
from types import SimpleNamespace

import numpy as np
import pytest

from engine.runner import prompt_scores
from engine.runner.prompt_scores import PromptScorer
from protocol import messages as m
from tests.engine.model.test_hybrid import CHUNK, engine, model_file, read, runner  # noqa: F401 (fixtures)

VOCAB = 7


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    return x - x.max(axis=-1, keepdims=True) - np.log(np.exp(x - x.max(axis=-1, keepdims=True)).sum(-1, keepdims=True))


def test_a_row_read_again_from_a_mark_is_not_scored_twice():
    prompt = tuple(range(10))
    rows = np.random.default_rng(0).standard_normal((len(prompt), VOCAB))  # row r's "logits" (the head: identity)
    model = SimpleNamespace(ops=SimpleNamespace(logits=lambda hidden, head: hidden), w=SimpleNamespace(head=None),
                            backend=SimpleNamespace(to_host=lambda a: a))
    scorer = PromptScorer(tuple(t % VOCAB for t in prompt), 1, model)
    for start, end in ((0, 4), (0, 6), (4, 10)):  # the second read starts again at a mark before rows scored
        wanted = scorer.wanted(start, end)
        scorer.add(rows[start:end][wanted], start, end)
    lines = scorer.take(3)
    assert [line.start for line in lines] == [1, 5, 7] and all(line.id == 3 for line in lines)
    got = [v for line in lines for v in line.logprobs]
    want = log_softmax(rows[:-1])[np.arange(len(prompt) - 1), [t % VOCAB for t in prompt[1:]]]
    assert got == pytest.approx(list(want), abs=1e-12)  # rows 0..8 once each, in order (9 draws the first token)


def test_a_long_read_goes_through_the_head_a_slice_of_rows_at_a_time(monkeypatch):
    """A step's rows through the head SCORE_ROWS at a time (their logits would otherwise be the step's rows times the
    vocabulary, 2.5 GB at 4,096 rows of Qwen's), each prompt token still scored once, as from the whole."""
    monkeypatch.setattr(prompt_scores, "SCORE_ROWS", 3)
    prompt = tuple(t % VOCAB for t in range(11))
    rows = np.random.default_rng(1).standard_normal((len(prompt), VOCAB))
    seen = []
    model = SimpleNamespace(ops=SimpleNamespace(logits=lambda hidden, head: seen.append(len(hidden)) or hidden),
                            w=SimpleNamespace(head=None), backend=SimpleNamespace(to_host=lambda a: a))
    scorer = PromptScorer(prompt, 2, model)
    for start, end in ((0, 8), (8, 11)):
        scorer.add(rows[start:end][scorer.wanted(start, end)], start, end)
    lines = scorer.take(1)
    assert seen == [3, 3, 2, 2] and [line.start for line in lines] == [1, 4, 7, 9]
    want = log_softmax(rows[:-1])[np.arange(len(prompt) - 1), list(prompt[1:])]
    assert [v for line in lines for v in line.logprobs] == pytest.approx(list(want), abs=1e-12)
    assert sum(len(line.top) for line in lines) == len(prompt) - 1


@pytest.mark.parametrize("model_file", ["qwen3next"], indirect=True)  # (the families share the scorer; one engine)
def test_a_hybrid_model_s_prompt_is_scored_as_its_prefixes_read_alone_give(engine, runner):  # noqa: F811
    prompt = [int(t) for t in np.random.default_rng(3).integers(1, 200, 2 * CHUNK + 20)]
    engine.send(m.Gen(1, tuple(prompt), {"temperature": 0.0, "prompt_logprobs": 2, "reuse": 0}, 40))
    lines = [msg for msg in engine.read_until(m.Done, ident=40) if isinstance(msg, m.PromptLogprobs)]
    got = [v for line in lines for v in line.logprobs]
    assert lines[0].start == 1 and len(got) == len(prompt) - 1
    table = list(range(runner.pool.blocks_for(len(prompt))))
    want = [float(log_softmax(read(runner, prompt[: i + 1], table, ())[0])[prompt[i + 1]]) for i in range(len(got))]
    assert got == pytest.approx(want, abs=1e-4)
