"""Prompts tokenized in segments cut before control tokens (engine/modelfile/token_segments.py): the ids
always those of the whole text, on the default model's vocabulary and llama.cpp's Llama 3 and Qwen2
vocabulary files; segments seen before reused; the memory bounded; the limit counted across segments."""
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.modelfile.token_segments import SegmentCache, TooManyTokens, digest, safe_markers
from engine.modelfile.tokenizer import load_tokenizer

VOCAB = Path(__file__).parents[2] / "fixtures/vocab"


@pytest.fixture(scope="module", params=["default", "ggml-vocab-llama-bpe.gguf", "ggml-vocab-qwen2.gguf"])
def any_tokenizer(request, model_path):
    return load_tokenizer(model_path if request.param == "default" else str(VOCAB / request.param))


def whole(tok, text: str) -> list[int]:
    return tok.tk.encode_batch_fast([text], add_special_tokens=False)[0].ids


# pieces a chat's text is made of, and the ones that could fool a cut: halves of markers, spaces and
# newlines beside them (pre-tokenizers look ahead at the next character), digits, accents, emoji
PIECES = ["<|im_start|>", "<|im_end|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|endoftext|>",
          "<think>", "</think>", "<tool_call>", "<|", "|>", "<|im_", "_start|>", "<", ">", "|", " ", "  ", "\n", "\n\n",
          "\t", " \n", "system", "user", "assistant", "Hello", " world", "12345", "3.14", "é", "ü", "你好", "🙂",
          "'s", "'ll", "x", "_", "-", "```", "{\"a\": 1}"]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.sampled_from(PIECES), max_size=40))
def test_segmented_ids_equal_the_whole_texts(any_tokenizer, pieces):
    text = "".join(pieces)
    bos = [any_tokenizer.special.bos] if any_tokenizer.special.add_bos and any_tokenizer.special.bos is not None else []
    assert any_tokenizer.segments.pattern is not None  # cut in segments, not whole
    assert any_tokenizer.encode(text) == bos + whole(any_tokenizer, text)
    assert any_tokenizer.encode(text) == bos + whole(any_tokenizer, text)  # again, from what it remembered
    assert any_tokenizer.count(text) == len(bos) + len(whole(any_tokenizer, text))


def conversation(turns: int) -> list[dict]:
    msgs = [{"role": "system", "content": "You are a careful agent. " * 50}]
    for i in range(turns):
        msgs += [{"role": "user", "content": f"Tool result {i}: " + "data, " * 30},
                 {"role": "assistant", "content": f"Step {i} done."}]
    return msgs + [{"role": "user", "content": "Go on."}]


def test_a_conversations_next_turn_tokenizes_only_what_is_new(tokenizer):
    cache = tokenizer.segments
    first = tokenizer.apply_chat_template(conversation(5))
    tokenizer.encode(first)
    seen = set(cache.kept)
    second = tokenizer.apply_chat_template(conversation(6))
    parts = cache.segments(second)
    new = [p for p in parts if digest(p) not in seen]
    assert len(parts) > 10 and 0 < len(new) <= 4, new  # the new turn's messages and the prompt's end
    assert tokenizer.encode(second) == [tokenizer.special.bos] * tokenizer.special.add_bos + whole(tokenizer, second)


def test_what_it_remembers_stays_within_its_budget(tokenizer):
    cache = SegmentCache(tokenizer.tk, ["<|im_start|>"], list(tokenizer.added), max_tokens=50)
    for i in range(30):
        text = f"<|im_start|>user\nmessage number {i} with a few words<|im_end|>"
        assert [t for ids in cache.encode(text) for t in ids] == whole(tokenizer, text)
        assert cache.size == sum(map(len, cache.kept.values())) <= 50
    assert digest("<|im_start|>user\nmessage number 29 with a few words<|im_end|>") in cache.kept  # the latest kept


def test_the_limit_counts_remembered_and_new_segments_alike(tokenizer):
    text = "<|im_start|>" + "word " * 100 + "<|im_start|>" + "more " * 100
    n = len(whole(tokenizer, text))
    tokenizer.encode(text[:len(text) // 2])  # part of it remembered
    with pytest.raises(TooManyTokens) as e:
        tokenizer.encode(text, add_bos=False, limit=n - 1)
    assert e.value.tokens == n
    assert tokenizer.encode(text, add_bos=False, limit=n) == whole(tokenizer, text)


def test_a_marker_an_added_token_could_reach_into_is_not_cut_before():
    # "ab<x>" would match across a cut before "<x>" in "ab<x>": that marker is not used
    assert safe_markers(["<x>", "<y>"], ["<x>", "<y>", "ab<x", "q<y>z"]) == []
    assert safe_markers(["<x>", "<y>"], ["<x>", "<y>", "</x>"]) == ["<x>", "<y>"]
