"""The whole product as a user meets it: strata-server over the real engine and the default model."""
import openai
import pytest

from tests.harness import ServerProcess

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def client():
    with ServerProcess(extra=["--device", "cpu", "--ctx", "2048"]) as server:
        yield openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def test_the_capital_of_france_is_paris(client):
    r = client.chat.completions.create(model="smollm2", messages=QUESTION, temperature=0, max_tokens=20)
    assert r.choices[0].message.content == "The capital of France is Paris."
    assert r.choices[0].finish_reason == "stop"


def test_stream_equals_non_stream_on_the_real_model(client):
    args = dict(model="smollm2", messages=[{"role": "user", "content": "Name three colours."}],
                temperature=0.7, seed=11, max_tokens=24)
    whole = client.chat.completions.create(**args).choices[0].message.content
    streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(stream=True, **args))
    assert streamed == whole and whole


def test_same_seed_same_text(client):
    args = dict(model="smollm2", prompt="Once upon a time", temperature=1.0, seed=3, max_tokens=16)
    assert client.completions.create(**args).choices[0].text == client.completions.create(**args).choices[0].text
