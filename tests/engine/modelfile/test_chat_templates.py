"""Each family's chat template (the Jinja files the models ship, as in llama.cpp's models/templates)
rendered through the sandboxed environment: system prompts, multi-turn history, and Qwen3's
enable_thinking switch passed as chat_template_kwargs."""
from __future__ import annotations

from pathlib import Path

import pytest

from engine.modelfile.tokenizer import ChatTemplate, SpecialTokens

TEMPLATES = Path(__file__).parents[2] / "fixtures/templates"
QWEN = SpecialTokens(bos=None, eos=151645, eos_text="<|im_end|>", bos_text="", add_bos=False)
LLAMA3 = SpecialTokens(bos=128000, eos=128009, eos_text="<|eot_id|>", bos_text="<|begin_of_text|>", add_bos=True)
HISTORY = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
           {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "2+2?"}]


def template(name: str, special: SpecialTokens) -> ChatTemplate:
    return ChatTemplate((TEMPLATES / name).read_text(), special)


def test_qwen3_renders_history_and_thinks_by_default():
    t = template("Qwen-Qwen3-0.6B.jinja", QWEN)
    text = t.render(HISTORY)
    assert t.thinks
    assert text == ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
                    "<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n"
                    "<|im_start|>assistant\n")


def test_qwen3_without_thinking_closes_an_empty_thought_in_the_prompt():
    text = template("Qwen-Qwen3-0.6B.jinja", QWEN).render(HISTORY, {"enable_thinking": False})
    assert text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_qwen3_drops_earlier_turns_reasoning_from_the_history():
    """Qwen3's template keeps only the answer of past assistant turns (their <think> text goes)."""
    history = HISTORY[:2] + [{"role": "assistant", "content": "<think>\nhmm\n</think>\n\nHello!"}] + HISTORY[3:]
    text = template("Qwen-Qwen3-0.6B.jinja", QWEN).render(history)
    assert "hmm" not in text and "<|im_start|>assistant\nHello!<|im_end|>" in text


def test_qwen35_leaves_its_thought_open_unless_thinking_is_off():
    """Qwen3.5 (and the hybrids' templates after it) writes the opening <think> itself: the answer starts
    as reasoning (serve/api/reasoning.py reads it so)."""
    t = template("Qwen-Qwen3.5-4B.jinja", QWEN)
    assert t.thinks
    assert t.render(HISTORY) == ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
                                 "<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n"
                                 "<|im_start|>assistant\n<think>\n")
    assert t.render(HISTORY, {"enable_thinking": False}).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_qwen25_gives_its_own_default_system_prompt():
    t = template("Qwen-Qwen2.5-7B-Instruct.jinja", QWEN)
    text = t.render([{"role": "user", "content": "Hi"}])
    assert not t.thinks
    assert text.startswith("<|im_start|>system\nYou are Qwen, created by Alibaba Cloud.")
    assert text.endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")


def test_llama31_renders_headers_and_its_dated_system_prompt():
    text = template("meta-llama-Llama-3.1-8B-Instruct.jinja", LLAMA3).render(HISTORY)
    assert text.startswith("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n")
    assert "Cutting Knowledge Date" in text and "Be brief.<|eot_id|>" in text
    assert text.endswith("<|start_header_id|>user<|end_header_id|>\n\n2+2?<|eot_id|>"
                         "<|start_header_id|>assistant<|end_header_id|>\n\n")


def test_template_kwargs_may_not_replace_what_the_server_sets():
    with pytest.raises(ValueError, match="may not set messages"):
        template("Qwen-Qwen3-0.6B.jinja", QWEN).render(HISTORY, {"messages": []})
