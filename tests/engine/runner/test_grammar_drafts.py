"""A constrained answer's drafts (engine/runner/grammar_drafts.py) on the default model's real vocabulary and a real
tool-call-like schema: the stretch the grammar allows alone is proposed whole and is what the grammar then takes, a
drafter's tokens are cut at the first the grammar refuses, and neither query moves the grammar's state."""
import json
from types import SimpleNamespace

import llguidance
import pytest

from engine.modelfile.grammar_tokenizer import GrammarTokenizer
from engine.runner.grammar_drafts import allowed_drafts, forced_drafts
from engine.runner.grammar_mask import Constraint

SCHEMA = {"type": "object", "properties": {"name": {"const": "edit_file"}, "arguments": {
    "type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"], "additionalProperties": False}},
    "required": ["name", "arguments"], "additionalProperties": False}
CALL = '{"name":"edit_file","arguments":{"path":"a.py"}}'


@pytest.fixture()
def constraint(tokenizer):
    grammar = llguidance.LLMatcher.grammar_from_json_schema(SCHEMA, defaults={"whitespace_flexible": False})
    return Constraint(GrammarTokenizer(tokenizer, tokenizer.vocab_size), grammar)


def seq_with(constraint, watches=True):
    return SimpleNamespace(sampler=SimpleNamespace(constraint=constraint), drafter=SimpleNamespace(watches=watches))


def test_the_forced_stretch_is_drafted_whole_and_taken_by_the_grammar(constraint, tokenizer):
    constraint.accept(tokenizer.encode('{"')[0])  # the model opens the object
    forced = forced_drafts(seq_with(constraint), room=64, cost=0.2)
    # (up to the last token that cannot merge with the model's text: its next may be '":"' or '":"a')
    assert tokenizer.decode(forced) == 'name":"edit_file","arguments":{"path'
    assert constraint.forced() == forced  # a query: nothing consumed
    for token in forced:
        constraint.accept(token)
    assert constraint.forced() == []  # the path's first token is the model's choice
    assert forced_drafts(seq_with(constraint), room=64, cost=0.2) == []
    assert constraint.allowed_run(tokenizer.encode('":"a.py"}}')) > 0


def test_no_forced_drafts_where_they_cannot_pay_or_be_taken(constraint, tokenizer):
    constraint.accept(tokenizer.encode('{"')[0])
    assert len(forced_drafts(seq_with(constraint), room=3, cost=0.2)) == 3  # the answer's room
    assert forced_drafts(seq_with(constraint), room=64, cost=1.0) == []  # a row dearer than a step
    assert forced_drafts(seq_with(constraint, watches=False), room=64, cost=0.2) == []  # a draft model's drafter
    assert forced_drafts(seq_with(None), room=64, cost=0.2) == []


def test_a_drafters_tokens_are_cut_where_the_grammar_refuses(constraint, tokenizer):
    good = tokenizer.encode(CALL)
    assert allowed_drafts(seq_with(constraint), good) == good
    bad = tokenizer.encode('{"name":"delete_file"')
    kept = allowed_drafts(seq_with(constraint), bad)
    assert 0 < len(kept) < len(bad) and tokenizer.decode(kept) in '{"name":"'
    assert allowed_drafts(seq_with(None), bad) == bad
    assert json.loads(CALL)  # (the call the grammar allows is JSON)
