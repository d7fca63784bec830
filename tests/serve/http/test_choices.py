"""`n` answers to one prompt (serve/http/choices.py) on the real engine and the default model, through
the openai client: seeded apart and reproducible, the first the same as n=1's, streamed and not, the
usage of them all, and the prompt read once (the others reuse its blocks)."""
from __future__ import annotations

import re

import httpx
import openai
import pytest


ASK = [{"role": "user", "content": "Write a short poem about the sea."}]


@pytest.fixture(scope="module")
def server(default_server):
    return default_server  # (tests/serve/conftest.py)


@pytest.fixture(scope="module")
def client(default_client):
    return default_client


def reused_tokens(server) -> float:
    text = httpx.get(server.url + "/metrics").text
    return float(re.search(r"^strata_prompt_reused_tokens_total (\S+)$", text, re.M).group(1))


def test_seeded_choices_differ_repeat_and_the_first_is_n1s(client):
    ask = dict(model="m", messages=ASK, max_tokens=10, temperature=1.0, seed=42)
    r = client.chat.completions.create(**ask, n=3)
    texts = [c.message.content for c in r.choices]
    assert [c.index for c in r.choices] == [0, 1, 2] and len(set(texts)) == 3
    assert all(c.finish_reason == "length" for c in r.choices) and r.usage.completion_tokens == 3 * 10
    assert [c.message.content for c in client.chat.completions.create(**ask, n=3).choices] == texts
    assert client.chat.completions.create(**ask).choices[0].message.content == texts[0]


def test_streamed_choices_equal_the_whole_ones_and_the_prompt_is_read_once(server, client):
    prompt = "Facts about the ocean:\n" + "".join(f"{i}. The ocean is deep and wide.\n" for i in range(30))
    ask = dict(model="m", prompt=prompt, max_tokens=8, temperature=0.9, seed=7, n=4)
    before = reused_tokens(server)
    whole = client.completions.create(**ask)
    reused = reused_tokens(server) - before
    assert reused >= 3 * 128, reused  # the 3 others found the prompt's blocks (the first read it)
    texts = {}
    for chunk in client.completions.create(**ask, stream=True, stream_options={"include_usage": True}):
        for c in chunk.choices:
            texts[c.index] = texts.get(c.index, "") + c.text
        usage = chunk.usage or None
    assert [texts[i] for i in range(4)] == [c.text for c in whole.choices]
    assert usage.completion_tokens == whole.usage.completion_tokens and usage.prompt_tokens == whole.usage.prompt_tokens


def test_more_than_16_choices_is_a_clear_400(client):
    with pytest.raises(openai.BadRequestError, match="less than or equal to 16"):
        client.chat.completions.create(model="m", messages=ASK, max_tokens=2, n=17)
