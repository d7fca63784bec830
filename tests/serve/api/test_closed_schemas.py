"""A forced call's arguments take the declared properties only (serve/api/constraints.py `closed`, the
rule of llama.cpp's common/json-schema.cpp): an object schema that lists properties and says nothing
of additionalProperties is closed, at every depth; one that says allows what it says."""
import json

import llguidance

from serve.api.constraints import closed
from engine.modelfile.grammar_tokenizer import GrammarTokenizer
from engine.modelfile.tokenizer import load_tokenizer
from engine.startup import resolve_model_path

SCHEMA = {"type": "object", "properties": {"city": {"type": "string"},
                                           "where": {"type": "object", "properties": {"lat": {"type": "number"}}},
                                           "properties": {"type": "object", "properties": {}}},
          "required": ["city"], "$defs": {"properties": {"type": "object", "properties": {"x": {}}}}}


def test_objects_with_properties_are_closed_at_every_depth_and_nothing_else_changes():
    out = closed(SCHEMA)
    assert out["additionalProperties"] is False and out["properties"]["where"]["additionalProperties"] is False
    assert out["properties"]["properties"]["additionalProperties"] is False  # a property named "properties"
    assert "additionalProperties" not in out["properties"]["city"]
    assert out["$defs"]["properties"]["additionalProperties"] is False and "additionalProperties" not in out["$defs"]
    assert closed({"type": "object", "properties": {}, "additionalProperties": True})["additionalProperties"] is True
    assert closed({"const": {"properties": {}}}) == {"const": {"properties": {}}}  # data is left alone
    assert SCHEMA["properties"]["where"] == {"type": "object", "properties": {"lat": {"type": "number"}}}  # a copy


def test_the_grammar_refuses_an_undeclared_key():
    tokenizer = load_tokenizer(str(resolve_model_path(None)))
    lltok = GrammarTokenizer(tokenizer, tokenizer.vocab_size).lltokenizer

    def accepts(schema, value) -> bool:
        matcher = llguidance.LLMatcher(lltok, llguidance.LLMatcher.grammar_from_json_schema(schema))
        ok = all(matcher.consume_token(t) for t in tokenizer.encode(json.dumps(value), add_bos=False))
        return ok and not matcher.is_error()

    value = {"city": "Paris", "type": "town"}
    assert accepts(SCHEMA, value) and not accepts(closed(SCHEMA), value)
    assert accepts(closed(SCHEMA), {"city": "Paris"})
