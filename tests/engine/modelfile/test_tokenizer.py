"""Tokenizer golden ids (made by llama.cpp's tokenizer, tools/fixtures/make_tokenizer_fixture.py),
chat template, and incremental detokenization."""
import json
from pathlib import Path

import pytest

from engine.modelfile.token_segments import TooManyTokens

FIXTURE = json.loads((Path(__file__).parents[2] / "fixtures/tokenizer_golden.json").read_text())


@pytest.mark.parametrize("case", FIXTURE["cases"], ids=[repr(c["text"][:20]) for c in FIXTURE["cases"]])
def test_token_ids_match_llama_cpp(tokenizer, case):
    assert tokenizer.encode(case["text"]) == case["ids"]


@pytest.mark.parametrize("case", FIXTURE["cases"], ids=[repr(c["text"][:20]) for c in FIXTURE["cases"]])
def test_decode_inverts_encode_for_plain_text(tokenizer, case):
    if "<|" not in case["text"]:
        assert tokenizer.decode(case["ids"]) == case["text"]


def test_chat_template_renders_chatml_with_the_default_system_prompt(tokenizer):
    text = tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}])
    assert text.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    assert text.endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")


def test_chat_template_keeps_a_given_system_prompt(tokenizer):
    text = tokenizer.apply_chat_template([{"role": "system", "content": "Be brief."},
                                          {"role": "user", "content": "Hi"}])
    assert text.startswith("<|im_start|>system\nBe brief.<|im_end|>\n") and "SmolLM" not in text


def test_special_tokens_in_text_become_their_ids(tokenizer):
    assert tokenizer.encode("<|im_start|>") == [1]
    assert tokenizer.encode("<|im_end|>") == [2]


@pytest.mark.parametrize("text", ["emoji 😀👍🏽 flags 🇫🇷", "日本語のテキスト", "plain ascii", "Ünïcödé — …"])
def test_streamed_detokenization_never_emits_broken_utf8(tokenizer, text):
    stream = tokenizer.stream()
    pieces = [stream.step(t) for t in tokenizer.encode(text)]
    assert all("\ufffd" not in p for p in pieces)
    assert "".join(pieces) == text


def test_streamed_detokenization_skips_special_tokens(tokenizer):
    stream = tokenizer.stream()
    assert "".join(stream.step(t) for t in tokenizer.encode("Hi<|im_end|>")) == "Hi"


@pytest.mark.parametrize("case", FIXTURE["cases"][:6], ids=[repr(c["text"][:20]) for c in FIXTURE["cases"][:6]])
def test_a_limit_refuses_a_longer_text_with_its_count_and_count_agrees(tokenizer, case):
    ids = tokenizer.encode(case["text"])
    assert tokenizer.count(case["text"]) == len(ids)
    assert tokenizer.encode(case["text"], limit=len(ids)) == ids
    if ids:
        with pytest.raises(TooManyTokens) as refused:
            tokenizer.encode(case["text"], limit=len(ids) - 1)
        assert refused.value.tokens == len(ids)
