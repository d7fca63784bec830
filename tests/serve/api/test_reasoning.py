"""A thinking model's <think>...</think> split from its answer (serve/api/reasoning.py): any cut of the
output into stream pieces gives the same reasoning and answer; through the server, reasoning_content
beside content, streamed and not, or inline under --reasoning-format none."""
from __future__ import annotations

from pathlib import Path

import openai
import pytest
from hypothesis import given, strategies as st

from serve.api.reasoning import CONTENT, REASONING, ReasoningSplitter, prompt_opens_thinking, split_all
from tests.harness import ServerProcess
from tests.serve.helpers import make_thinking_model, scripted_engine_cmd

OUTPUT = "<think>\nThe user greets me; answer briefly.\n</think>\n\nHello there!"


def test_a_whole_output_splits_into_reasoning_and_answer():
    assert split_all(OUTPUT) == {REASONING: "The user greets me; answer briefly.", CONTENT: "Hello there!"}
    assert split_all("No thoughts, just an answer.") == {REASONING: "", CONTENT: "No thoughts, just an answer."}
    assert split_all("opened by the prompt</think>answer", opened=True) == {REASONING: "opened by the prompt",
                                                                           CONTENT: "answer"}
    assert split_all("<think>cut off by max_tokens") == {REASONING: "cut off by max_tokens", CONTENT: ""}
    assert split_all("a < b and <thinking> is not the tag") == {REASONING: "", CONTENT: "a < b and <thinking> is not the tag"}


OUTPUTS = [(OUTPUT, False), ("\n\n<think>\n\n</think>\n\nAn empty thought.", False), ("a < b, <thi", False),
           ("opened by the prompt\n\n</think>\n\nanswer with </think> inside", True),
           ("<think>\nnever closed\n\n", False), ("</think>only an answer", True)]


@given(st.sampled_from(OUTPUTS), st.lists(st.floats(0, 1), max_size=12))
def test_any_cut_into_pieces_splits_alike(case, fractions):
    text, opened = case
    bounds = sorted({0, len(text), *(int(f * len(text)) for f in fractions)})
    splitter, fields = ReasoningSplitter(opened), {REASONING: "", CONTENT: ""}
    for a, b in zip(bounds, bounds[1:]):
        for field, part in splitter.feed(text[a:b]):
            fields[field] += part
    for field, part in splitter.finish():
        fields[field] += part
    assert fields == split_all(text, opened)


def test_a_prompt_that_opens_the_thought_is_recognized():
    assert prompt_opens_thinking("<|im_start|>assistant\n<think>\n")
    assert not prompt_opens_thinking("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert not prompt_opens_thinking("<|im_start|>assistant\n")


@pytest.fixture(scope="module")
def thinking_model(tmp_path_factory) -> Path:
    return make_thinking_model(tmp_path_factory.mktemp("thinking"))


def server(model: Path, *extra: str) -> ServerProcess:
    return ServerProcess(engine_cmd=scripted_engine_cmd(model, OUTPUT), extra=["--model", str(model), *extra])


def test_the_server_returns_reasoning_content_beside_content(thinking_model):
    with server(thinking_model).start() as s:
        client = openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0)
        args = dict(model="any", messages=[{"role": "user", "content": "Hi"}], max_tokens=200)
        whole = client.chat.completions.create(**args)
        message = whole.choices[0].message
        assert message.content == "Hello there!" and message.reasoning_content == "The user greets me; answer briefly."
        assert whole.choices[0].finish_reason == "stop"
        chunks = list(client.chat.completions.create(stream=True, **args))
        deltas = [c.choices[0].delta for c in chunks if c.choices]
        assert "".join(getattr(d, "reasoning_content", None) or "" for d in deltas) == message.reasoning_content
        assert "".join(d.content or "" for d in deltas) == "Hello there!"
        no_thinking = client.chat.completions.create(extra_body={"chat_template_kwargs": {"enable_thinking": False}},
                                                     **args)
        assert no_thinking.usage.prompt_tokens > whole.usage.prompt_tokens  # the empty thought is in the prompt
        with pytest.raises(openai.BadRequestError, match="may not set messages"):
            client.chat.completions.create(extra_body={"chat_template_kwargs": {"messages": []}}, **args)


def test_reasoning_stays_inline_when_asked(thinking_model):
    with server(thinking_model, "--reasoning-format", "none").start() as s:
        client = openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0)
        r = client.chat.completions.create(model="any", messages=[{"role": "user", "content": "Hi"}], max_tokens=200)
        assert r.choices[0].message.content == OUTPUT
        assert getattr(r.choices[0].message, "reasoning_content", None) is None
