"""Llama 3.1 may open a call with its special token <|python_tag|>: a forced call's grammar takes
that token before the JSON call as well as the JSON alone (the mask never offers a token the
grammar then refuses), and the token, a control token, never shows in the parsed text. On Llama 3's
real vocabulary (llama.cpp's ggml-vocab-llama-bpe.gguf) with its reserved token 128010 named as
Llama 3.1 names it."""
from __future__ import annotations

import json

import gguf
import llguidance

from engine.modelfile.gguf_file import GGUFFile
from engine.modelfile.grammar_tokenizer import GrammarTokenizer
from engine.modelfile.tokenizer import load_tokenizer
from serve.api.chat import ToolPlan
from serve.api.constraints import tool_grammar
from serve.api.tool_calls import FORMATS, parse_all
from tests.harness import ROOT

VOCAB = ROOT / "tests/fixtures/vocab/ggml-vocab-llama-bpe.gguf"
PYTHON_TAG = 128010
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


def value_type(value) -> tuple[gguf.GGUFValueType, gguf.GGUFValueType | None]:
    """The GGUF types the vocabulary file stores its tokenizer's keys in: strings, arrays of strings
    (tokens, merges) or INT32 (token types), UINT32 token ids."""
    t = gguf.GGUFValueType
    if isinstance(value, list):
        return t.ARRAY, t.STRING if isinstance(value[0], str) else t.INT32
    return (t.STRING if isinstance(value, str) else t.UINT32), None


def llama31_vocab(path) -> str:
    # read by the engine's GGUFFile (gguf.GGUFReader's values, test_gguf_file.py): GGUFReader takes ~40 s
    # of CPU over the 128K tokens and 280K merges; the file written is the same bytes
    reader = GGUFFile(str(VOCAB))
    writer = gguf.GGUFWriter(str(path), "llama")
    for key, field in reader.fields.items():
        if not key.startswith("tokenizer."):
            continue
        value = field.contents()
        if key == "tokenizer.ggml.tokens":
            value[PYTHON_TAG] = "<|python_tag|>"
        kind, sub = value_type(value)
        writer.add_key_value(key, value, kind, sub_type=sub)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    return str(path)


def test_a_forced_llama3_call_may_open_with_the_python_tag(tmp_path):
    tokenizer = load_tokenizer(llama31_vocab(tmp_path / "llama31-vocab.gguf"))
    assert tokenizer.added_token_id("<|python_tag|>") == PYTHON_TAG
    lltokenizer = GrammarTokenizer(tokenizer, tokenizer.vocab_size).lltokenizer
    grammar = tool_grammar(ToolPlan(FORMATS["llama3"], [WEATHER], "required"), tokenizer)
    call = json.dumps({"name": "get_weather", "parameters": {"city": "Oslo"}}, separators=(",", ":"))

    def accepts(ids) -> bool:
        matcher = llguidance.LLMatcher(lltokenizer, grammar, log_level=0)
        return all(matcher.consume_token(t) for t in ids) and matcher.is_accepting()

    body = tokenizer.encode(call, add_bos=False)
    assert accepts([PYTHON_TAG] + body) and accepts(body) and not accepts(tokenizer.encode("Hi", add_bos=False))
    text = tokenizer.decode([PYTHON_TAG] + body)
    assert text == call  # a control token: not in the text the parser reads
    content, calls, _ = parse_all(FORMATS["llama3"], text, True, [WEATHER])
    assert (content, [(c.name, json.loads(c.arguments)) for c in calls]) == ("", [("get_weather", {"city": "Oslo"})])
