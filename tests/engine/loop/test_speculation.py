"""Speculative decoding with n-gram drafts (engine/loop/decode_steps.py) on the real engine process and the
default model: a greedy request's tokens and final state are the same with and without drafts (a
draft's row is a decode row like any other), alone, beside other decoders, and with a repetition
penalty; the drafted and accepted counts come with its DONE; a seeded sampled request's tokens are
the same too."""
import pytest

from engine.modelfile.model_path import default_model_path
from engine.modelfile.tokenizer import load_tokenizer
from protocol import messages as m
from tests.harness import PY, EngineProcess
from tools.checks import preempt_scenarios as sc

PASSAGE = ("def area(width, height):\n    return width * height\n\n\ndef perimeter(width, height):\n"
           "    return 2 * (width + height)\n")
MAX_NEW = 40


@pytest.fixture(scope="module")
def engine():
    e = EngineProcess([PY, "-m", "engine", "--serve", "--device", "cpu", "--ctx", "1024", "--speculative", "ngram",
                       "--draft-max", "6", "--draft-row-cost", "0"])  # (free rows: every draft made, the pace aside)
    e.handshake()
    yield e
    e.close()


@pytest.fixture(scope="module")
def rewrite():
    """A request to repeat a short file: its answer quotes its prompt."""
    tok = load_tokenizer(str(default_model_path()))
    return tuple(tok.encode(f"<|im_start|>user\nCopy this code exactly:\n{PASSAGE}<|im_end|>\n<|im_start|>assistant\n"
                            f"{PASSAGE[:20]}"))


def run(engine, ident: int, prompt, params: dict, spec: int) -> list[m.Message]:
    engine.send(m.Gen(MAX_NEW, tuple(prompt), {**params, "fp": 1, "reuse": 0, "spec": spec}, ident))
    return engine.read_until(m.Done, ident=ident)


@pytest.mark.parametrize("params", [{"temperature": 0.0, "seed": 0}, {"temperature": 0.0, "seed": 0, "repeat_penalty": 1.05}],
                         ids=["greedy", "penalized"])
def test_drafts_change_no_token_and_are_counted(engine, rewrite, params):
    plain, drafted = run(engine, 1, rewrite, params, 0), run(engine, 2, rewrite, params, 1)
    assert sc.tokens_of(drafted, 2) == sc.tokens_of(plain, 1)
    assert drafted[-1].extra["fp"] == plain[-1].extra["fp"]
    assert "drafted" not in plain[-1].extra
    drafted_n, accepted_n = int(drafted[-1].extra["drafted"]), int(drafted[-1].extra["accepted"])
    assert 0 < accepted_n <= drafted_n  # (a mild penalty: the answer still copies the prompt)


def test_drafts_beside_other_decoders_change_no_token(engine, rewrite):
    greedy = {"temperature": 0.0}
    alone = sc.tokens_of(run(engine, 3, rewrite, greedy, 1), 3)
    other = sc.tokens_of(run(engine, 4, rewrite[:30], greedy, 0), 4)
    engine.send(m.Gen(MAX_NEW, rewrite[:30], {**greedy, "reuse": 0, "spec": 0}, 5))
    engine.send(m.Gen(MAX_NEW, rewrite, {**greedy, "reuse": 0, "spec": 1}, 6))
    seen, done = [], set()
    while len(done) < 2:
        seen.append(engine.read())
        if isinstance(seen[-1], m.Done):
            done.add(seen[-1].id)
    assert sc.tokens_of(seen, 6) == alone and sc.tokens_of(seen, 5) == other


def test_a_seeded_sampled_request_draws_the_same_tokens_with_drafts(engine, rewrite):
    """A sampled row's draw takes the request's next uniform as a one-token step would: the same seed
    gives the same answer, and drafts of a copied passage are still kept (with probability p(draft))."""
    params = {"temperature": 0.7, "top_p": 0.95, "seed": 3}
    plain, drafted = run(engine, 7, rewrite, params, 0), run(engine, 8, rewrite, params, 1)
    assert sc.tokens_of(drafted, 8) == sc.tokens_of(plain, 7)
    assert drafted[-1].extra["fp"] == plain[-1].extra["fp"]
    assert int(drafted[-1].extra["accepted"]) > 0


def test_a_constrained_answer_drafts_its_grammars_forced_stretches(engine):
    """A tool call held to its schema (engine/runner/grammar_drafts.py): the keys and the one function's name are
    drafted whole and kept, and the call's tokens are those it has without drafts."""
    import llguidance

    from tests.engine.runner.test_grammar_drafts import SCHEMA
    tok = load_tokenizer(str(default_model_path()))
    prompt = tuple(tok.encode("<|im_start|>user\nCall edit_file on the file notes.txt.<|im_end|>\n<|im_start|>assistant\n"))
    grammar = llguidance.LLMatcher.grammar_from_json_schema(SCHEMA, defaults={"whitespace_flexible": False})
    params = {"temperature": 0.0, "seed": 0, "grammar": grammar}
    plain, drafted = run(engine, 9, prompt, params, 0), run(engine, 10, prompt, params, 1)
    assert sc.tokens_of(drafted, 10) == sc.tokens_of(plain, 9)
    assert drafted[-1].extra["fp"] == plain[-1].extra["fp"]
    assert tok.decode(sc.tokens_of(plain, 9)).startswith('{"name":"edit_file","arguments":{"path":"')
    assert int(drafted[-1].extra["accepted"]) >= 8  # (the forced keys: 10 tokens of this vocabulary or so)


def test_a_step_splits_into_forwards_of_at_most_max_batch_rows():
    """A request's newest token and its drafts go in one forward, at most max_batch rows a forward (the decode
    graphs' and the flash-decoding counters' 64): requests in order, a new forward where the next would not fit."""
    from types import SimpleNamespace

    from engine.loop.decode_steps import DecodeSteps

    steps = DecodeSteps(SimpleNamespace(max_batch=8, row_cost=None), None, None, None, None)
    seqs = [SimpleNamespace(name=i, drafts=[0] * d) for i, d in enumerate([3, 3, 0, 6, 7, 0, 0])]
    assert [[s.name for s in batch] for batch in steps.batches(seqs)] == [[0, 1], [2, 3], [4], [5, 6]]
    assert steps.batches([]) == []
