"""Log-probabilities (serve/api/logprobs.py) on the real engine and the default model, through the
openai client: chat completions (streamed and not), completions' legacy shape, the Responses API's
include, each checked against the model's own logits computed here in NumPy for the same tokens."""
from __future__ import annotations

import math

import numpy as np
import openai
import pytest

from engine.kvcache.kv import KVCache
from engine.model.forward import LlamaModel
from engine.model.weights import load_model
from engine.modelfile.model_path import default_model_path
from engine.modelfile.tokenizer import load_tokenizer
from engine.ops.backend import cpu_backend

ASK = [{"role": "user", "content": "Name three colours."}]
TOL = 1e-4


@pytest.fixture(scope="module")
def client(default_client):
    return default_client  # (tests/serve/conftest.py)


def reference(prompt: list[int], answer: list[int]) -> list[np.ndarray]:
    """(vocab,) float64 log-softmax of the logits before each answer token, from the model in NumPy."""
    backend = cpu_backend()
    cfg, weights, _ = load_model(str(default_model_path()), backend)
    model, kv = LlamaModel(cfg, weights, backend), KVCache(cfg, 1024, backend)
    logits, out = model.prefill(np.asarray(prompt), kv, 512), []
    for i, token in enumerate(answer):
        x = logits.astype(np.float64)
        out.append(x - x.max() - np.log(np.exp(x - x.max()).sum()))
        logits = model.forward(np.asarray([token]), len(prompt) + i, kv, want_logits=True)
    return out


def test_completion_logprobs_are_the_models_own(client):
    tok = load_tokenizer(str(default_model_path()))
    prompt = tok.encode("The capital of France is")
    r = client.completions.create(model="m", prompt=prompt, max_tokens=4, temperature=0, logprobs=5)
    lp = r.choices[0].logprobs
    answer = [tok.encode(t) for t in lp.tokens]  # (the text encoded whole may merge tokens: "\n\n")
    assert all(len(ids) == 1 for ids in answer)
    answer = [ids[0] for ids in answer]
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 4
    assert "".join(lp.tokens) == r.choices[0].text and lp.text_offset[0] == 0
    for i, ref in enumerate(reference(prompt, answer)):
        assert math.isclose(lp.token_logprobs[i], ref[answer[i]], abs_tol=TOL)
        best = np.argsort(-ref, kind="stable")[:5]
        assert list(lp.top_logprobs[i].values()) == pytest.approx(ref[best].tolist(), abs=TOL)
        assert lp.token_logprobs[i] == max(lp.top_logprobs[i].values())  # greedy: the likeliest


def test_chat_logprobs_streamed_equal_the_whole_answers(client):
    kwargs = dict(model="m", messages=ASK, max_tokens=12, temperature=0, logprobs=True, top_logprobs=3)
    whole = client.chat.completions.create(**kwargs).choices[0]
    content = whole.logprobs.content
    assert len(content) == 12 and all(len(c.top_logprobs) == 3 for c in content)
    assert bytes(b for c in content for b in c.bytes).decode() == whole.message.content
    assert all(c.top_logprobs[0].token == c.token and c.top_logprobs[0].logprob == c.logprob for c in content)
    assert all(a.logprob >= b.logprob for c in content for a, b in zip(c.top_logprobs, c.top_logprobs[1:]))
    streamed = [e for chunk in client.chat.completions.create(**kwargs, stream=True)
                if chunk.choices and chunk.choices[0].logprobs for e in chunk.choices[0].logprobs.content]
    assert [(e.token, e.logprob) for e in streamed] == [(c.token, c.logprob) for c in content]


def test_a_sampled_token_has_its_own_logprob_and_none_without_asking(client):
    r = client.chat.completions.create(model="m", messages=ASK, max_tokens=8, temperature=1.0, seed=5,
                                       logprobs=True).choices[0]
    assert len(r.logprobs.content) == 8 and all(c.logprob <= 0 and c.top_logprobs == [] for c in r.logprobs.content)
    plain = client.chat.completions.create(model="m", messages=ASK, max_tokens=8, temperature=1.0, seed=5).choices[0]
    assert plain.logprobs is None and plain.message.content == r.message.content


def test_responses_include_gives_the_texts_logprobs(client):
    asked = dict(model="m", input="Name three colours.", max_output_tokens=10, temperature=0,
                 include=["message.output_text.logprobs"], top_logprobs=2)
    part = client.responses.create(**asked).output[0].content[0]
    assert "".join(e.token for e in part.logprobs) == part.text and all(len(e.top_logprobs) == 2 for e in part.logprobs)
    deltas = [e for e in client.responses.create(**asked, stream=True) if e.type == "response.output_text.delta"]
    assert [(x.token, x.logprob) for e in deltas for x in e.logprobs] == [(x.token, x.logprob) for x in part.logprobs]


def test_an_echoed_prompt_is_scored_token_by_token_as_the_model_reads_it(client):
    """What evaluation harnesses score a text by (lm-eval's local-completions): echo with logprobs gives
    each prompt token's log-probability under the rows before it, the first none; streamed the same."""
    tok = load_tokenizer(str(default_model_path()))
    text = "The capital of France is Paris. The capital of Italy is Rome."
    prompt = tok.encode(text)
    ask = dict(model="m", prompt=text, max_tokens=2, temperature=0, logprobs=2, echo=True)
    r = client.completions.create(**ask).choices[0]
    lp = r.logprobs
    assert r.text.startswith(text) and "".join(lp.tokens) == r.text
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None and len(lp.tokens) == len(prompt) + 2
    ref = reference(prompt[:1], prompt[1:])
    assert lp.token_logprobs[1 : len(prompt)] == pytest.approx([float(x[t]) for x, t in zip(ref, prompt[1:])], abs=TOL)
    assert all(len(top) == 2 and max(top.values()) >= value
               for top, value in zip(lp.top_logprobs[1:], lp.token_logprobs[1:]))
    chunks = [c.choices[0] for c in client.completions.create(**ask, stream=True) if c.choices]
    assert "".join(c.text for c in chunks) == r.text
    assert [v for c in chunks if c.logprobs for v in c.logprobs.token_logprobs] == lp.token_logprobs


def test_bad_logprobs_fields_are_clear_400s(client):
    with pytest.raises(openai.BadRequestError, match="less than or equal to 20"):
        client.completions.create(model="m", prompt="Hi", max_tokens=2, logprobs=21)
