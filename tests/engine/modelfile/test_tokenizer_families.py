"""The pre-tokenizers of Qwen2 (`qwen2`) and Llama 3 (`llama-bpe`) beside SmolLM's: token ids equal
llama.cpp's on its own vocabulary test files (tests/fixtures/vocab: ggml-vocab-*.gguf with the .inp
strings and the .out ids llama.cpp's test-tokenizer-0 checks), and on a hypothesis fuzz of unicode
strings whose ids llama.cpp made (tests/fixtures/tokenizer_fuzz.json, tools/fixtures/make_tokenizer_fixture.py
--fuzz: arbitrary text and joins of what pre-tokenizers split on). An unknown pre-tokenizer is
refused by name."""
from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest
from gguf import GGUFReader, GGUFWriter

from engine.modelfile.model_config import ModelLoadError
from engine.modelfile.tokenizer import GGUFTokenizer, load_tokenizer

VOCAB = Path(__file__).parents[2] / "fixtures/vocab"
FAMILIES = ("qwen2", "llama-bpe")
FUZZ = json.loads((Path(__file__).parents[2] / "fixtures/tokenizer_fuzz.json").read_text(encoding="utf-8"))


def llama_cpp_cases(name: str) -> list[tuple[str, list[int]]]:
    """llama.cpp's test strings (separated by __ggml_vocab_test__ lines) and their ids, one line each."""
    base = VOCAB / f"ggml-vocab-{name}.gguf"
    texts = base.with_name(base.name + ".inp").read_text(encoding="utf-8").split("\n__ggml_vocab_test__\n")
    ids = base.with_name(base.name + ".out").read_text(encoding="utf-8").split("\n")
    return [(t, [int(x) for x in i.split()]) for t, i in zip(texts, ids)]


@functools.cache
def tokenizer(name: str) -> GGUFTokenizer:
    return load_tokenizer(str(VOCAB / f"ggml-vocab-{name}.gguf"))  # ~10 s: gguf's reader of 150K strings


@pytest.fixture(params=FAMILIES)
def family(request):
    return request.param, tokenizer(request.param)


def test_ids_equal_llama_cpps_on_its_own_test_strings(family):
    name, tok = family
    cases = llama_cpp_cases(name)
    assert len(cases) > 40
    wrong = [(text, tok.encode(text, add_bos=False), ids) for text, ids in cases if tok.encode(text, add_bos=False) != ids]
    assert not wrong, wrong[:3]


def test_decode_gives_the_text_back(family):
    _, tok = family
    for text, ids in llama_cpp_cases(family[0]):
        assert tok.decode(ids) == text


def test_ids_equal_llama_cpps_on_fuzzed_unicode(family):
    name, tok = family
    cases = FUZZ["vocabularies"][name]
    assert len(cases) >= 250
    wrong = [(c["text"], tok.encode(c["text"], add_bos=False), c["ids"]) for c in cases
             if tok.encode(c["text"], add_bos=False) != c["ids"]]
    assert not wrong, wrong[:3]


def test_llama3_adds_its_bos_by_default_and_qwen2_does_not():
    """llama.cpp's defaults when the file does not say: Llama 3 prompts start with <|begin_of_text|>."""
    llama3 = tokenizer("llama-bpe")
    assert llama3.encode("Hello")[0] == 128000 and llama3.encode("Hello", add_bos=False)[0] != 128000
    assert tokenizer("qwen2").encode("Hello") == [9707]


def test_an_unknown_pre_tokenizer_is_refused_by_name(tmp_path):
    path = tmp_path / "vocab.gguf"
    w = GGUFWriter(str(path), "qwen2")
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("falcon")
    w.add_token_list(["a", "b", "ab"])
    w.add_token_merges(["a b"])
    w.add_eos_token_id(0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()
    with pytest.raises(ModelLoadError, match="'falcon'.*qwen2"):
        GGUFTokenizer(GGUFReader(str(path)))
