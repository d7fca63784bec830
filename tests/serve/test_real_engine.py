"""The whole product as a user meets it: strata-server over the real engine and the default model."""
import httpx
import openai
import pytest

from tests.harness import ServerProcess, alive
from tests.serve.scheduling.test_scheduling import wait_for

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def server():
    with ServerProcess(extra=["--device", "cpu", "--ctx", "2048"]) as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


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


def test_a_named_session_s_prefix_waits_apart_from_one_off_requests(server, client):
    """A request naming its session (prompt_cache_key; Codex's session_id header alike) leaves its
    cached prefix in the pool's second queue, evicted only after one-off requests' blocks."""
    def pool() -> tuple[int, int]:
        kv = httpx.get(server.url + "/status").json()["kv"]
        return kv.get("kept", 0), kv.get("idle", 0)  # (reported from the first request on)

    kept, idle = pool()
    agent = [{"role": "system", "content": "You are a coding agent. " * 120}, {"role": "user", "content": "hi"}]
    client.chat.completions.create(model="smollm2", messages=agent, max_tokens=2, temperature=0,
                                   extra_body={"prompt_cache_key": "agent-1"})
    wait_for(lambda: pool()[0] > kept)  # once its answer's rows are read again (engine/loop/admission.py, settles)
    assert pool()[1] == idle
    kept = pool()[0]
    other = [{"role": "user", "content": "Summarize the history of Rome. " * 90}]
    client.chat.completions.create(model="smollm2", messages=other, max_tokens=2, temperature=0)
    wait_for(lambda: pool()[1] > idle)
    assert pool()[0] == kept
    again = client.chat.completions.create(model="smollm2", messages=agent, max_tokens=2, temperature=0,
                                           extra_headers={"session_id": "codex-session"})
    assert again.usage.prompt_tokens_details.cached_tokens > 0


def test_tensor_parallel_through_the_server():
    """--tp 3 forwarded to the engine: its two worker processes hold two thirds of every layer, the
    same answer comes back, and the workers are gone once the server stops."""
    with ServerProcess(extra=["--device", "cpu", "--ctx", "2048", "--tp", "3"]) as s:
        info = httpx.get(s.url + "/status").json()["engine_info"]
        assert info["tp"] == "3"
        workers = [int(pid) for pid in info["tp_pids"].split(",")]
        client = openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0)
        r = client.chat.completions.create(model="smollm2", messages=QUESTION, temperature=0, max_tokens=20)
        assert r.choices[0].message.content == "The capital of France is Paris."
    assert not [pid for pid in workers if alive(pid)]


def test_an_8_bit_cache_through_the_server():
    """--kv-type q8_0 forwarded to the engine: a quarter of the float32 cache's bytes, the float32
    cache's answer. Asked "What is 2 + 2?", not QUESTION: on the France question the default model's
    first token is a near tie under the 8-bit cache, and which side wins depends on OpenBLAS's kernel
    for the CPU (AVX-512 machines answer "L'Étoile, ..."); this answer is the same with every kernel
    (OPENBLAS_CORETYPE Haswell, SkylakeX, Sandybridge) and with the float32 cache."""
    with ServerProcess(extra=["--device", "cpu", "--ctx", "2048", "--kv-type", "q8_0"]) as s:
        info = httpx.get(s.url + "/status").json()["engine_info"]
        assert info["kv_type"] == "q8_0"
        assert int(info["kv_block_bytes"]) == 64 * 2 * 30 * 3 * 64 * 34 // 32  # block x K,V x layers x heads x d
        client = openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0)
        r = client.chat.completions.create(model="smollm2", messages=[{"role": "user", "content": "What is 2 + 2?"}],
                                           temperature=0, max_tokens=20)
        assert r.choices[0].message.content == "The answer to this classic math problem is 4."
