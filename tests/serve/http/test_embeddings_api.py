"""POST /v1/embeddings (serve/http/embeddings_api.py) through OpenAI's own client, on the default model
(SmolLM2, whose file names no pooling: the server is started with --pooling mean; chunks of 64, so that a
cancelled read stops soon) behind an API key; and
an embedding model's inputs ending with its EOS (Qwen3-Embedding's files ask for it; the tiny fixture of
tests/engine/model/test_embeddings.py does too)."""
from __future__ import annotations

import base64
from pathlib import Path
from types import SimpleNamespace

import httpx
import numpy as np
import openai
import pytest

from engine.modelfile.tokenizer import load_tokenizer
from serve.api.embeddings_schema import EmbeddingRequest, input_tokens
from serve.api.prompt_fit import PromptFit
from tests.harness import ServerProcess
from tests.serve.scheduling.test_scheduling import status, wait_for

KEY = "emb-key"
CAT, KITTEN = "The cat sat on the mat.", "A kitten was sitting on the rug."
TAXES = "Quarterly tax filings are due in April."


@pytest.fixture(scope="module")
def server():
    flags = ["--device", "cpu", "--ctx", "512", "--chunk", "64", "--pooling", "mean"]
    with ServerProcess(extra=flags, api_key=KEY) as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0)


def vectors(response) -> np.ndarray:
    return np.array([d.embedding for d in response.data], dtype=np.float32)


def test_vectors_are_unit_in_order_the_same_as_floats_and_base64_and_by_meaning(server, client):
    r = client.embeddings.create(model="any", input=[CAT, KITTEN, TAXES], encoding_format="float")
    assert [d.index for d in r.data] == [0, 1, 2] and r.model == client.models.list().data[0].id
    floats = vectors(r)
    assert floats.shape == (3, 576) and np.allclose(np.linalg.norm(floats, axis=1), 1, atol=1e-6)
    assert r.usage.prompt_tokens == r.usage.total_tokens > 3
    raw = httpx.post(server.url + "/v1/embeddings", json={"input": [CAT, KITTEN, TAXES], "encoding_format": "base64"},
                     headers={"authorization": f"Bearer {KEY}"}).json()
    decoded = np.array([np.frombuffer(base64.b64decode(d["embedding"]), "<f4") for d in raw["data"]])
    assert np.array_equal(decoded, floats) and raw["object"] == "list" and raw["data"][0]["object"] == "embedding"
    default = vectors(client.embeddings.create(model="any", input=[TAXES, CAT]))  # the client asks for base64
    assert np.array_equal(default, floats[[2, 0]])  # each input its own request: its order kept, the same bits
    assert floats[0] @ floats[1] > floats[0] @ floats[2] and floats[0] @ floats[1] > floats[1] @ floats[2]


def test_token_ids_and_dimensions(client, tokenizer):
    whole = vectors(client.embeddings.create(model="any", input=CAT))[0]
    ids = tokenizer.encode(CAT)
    assert np.array_equal(vectors(client.embeddings.create(model="any", input=ids))[0], whole)
    both = vectors(client.embeddings.create(model="any", input=[ids, ids[:3]]))
    assert np.array_equal(both[0], whole)
    cut = vectors(client.embeddings.create(model="any", input=CAT, dimensions=64))[0]
    assert cut.shape == (64,) and np.allclose(cut, whole[:64] / np.linalg.norm(whole[:64]), atol=1e-6)


@pytest.mark.parametrize("body, fragment", [
    ({"input": ""}, "input 0 is empty"),
    ({"input": []}, "input is empty"),
    ({"input": [[1, 2], []]}, "input 1 is empty"),
    ({"input": "x", "dimensions": 577}, "dimensions 577 is more than the model's 576"),
    ({"input": "x", "encoding_format": "int8"}, "encoding_format"),
    ({"input": "word " * 600}, "input 0 is too long"),
    ({"input": [[5, 10 ** 6]]}, "within the vocabulary"),
])
def test_bad_input_is_400(server, body, fragment):
    r = httpx.post(server.url + "/v1/embeddings", json=body, headers={"authorization": f"Bearer {KEY}"})
    assert r.status_code == 400 and fragment in r.json()["error"]["message"], r.text
    assert httpx.post(server.url + "/v1/embeddings", json={"input": "x"}).status_code == 401


def cancelled(server) -> float:
    lines = httpx.get(server.url + "/metrics").text.splitlines()
    return sum(float(x.split()[-1]) for x in lines if x.startswith('strata_requests_total{finish_reason="cancelled"}'))


def test_a_client_that_leaves_cancels_its_requests(server):
    before = cancelled(server)
    with pytest.raises(httpx.TimeoutException):
        httpx.post(server.url + "/v1/embeddings", json={"input": ["word " * 500] * 4},
                   headers={"authorization": f"Bearer {KEY}"}, timeout=0.5)
    wait_for(lambda: cancelled(server) == before + 4 and not status(server)["running"], timeout_s=30)


def test_an_embedding_model_s_text_ends_with_eos():
    fixture = Path(__file__).resolve().parents[2] / "fixtures/embedding/qwen3-embedding.gguf"
    tokenizer = load_tokenizer(str(fixture))
    state = SimpleNamespace(ctx=64, tokenizer=tokenizer)
    fit = PromptFit.of(tokenizer)
    eos = tokenizer.special.eos
    assert input_tokens(state, fit, EmbeddingRequest(input="a cat")) == [tokenizer.encode("a cat") + [eos]]
    assert input_tokens(state, fit, EmbeddingRequest(input=[7, 8])) == [[7, 8]]  # token ids as given
