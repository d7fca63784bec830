"""Several models behind one server (serve/model_set.py): by name, loaded at start (--preload) or on
first use, unloaded when idle; an unknown name is a 404 in each API's shape; a model that does not
fit the memory left unloads the least recently used idle one first, else is a 503 saying why. The
server runs the default model and the tiny hybrid fixtures (tests/fixtures/hybrid: another
tokenizer, so that which model answered shows in the prompt's token count)."""
from __future__ import annotations

import asyncio
import time
from pathlib import Path
from types import SimpleNamespace

import httpx
from prometheus_client.parser import text_string_to_metric_families
import openai
import pytest

from engine.modelfile.model_path import default_model_path
from serve.api.errors import APIError
from serve import model_set
from serve.config import ServerSettings
from tests.harness import ROOT, ServerProcess
from tests.serve.helpers import state_events

HYBRID = ROOT / "tests/fixtures/hybrid"
IDLE_S = 3.0


@pytest.fixture(scope="module")
def server():
    with ServerProcess(extra=["--model", f"smol={default_model_path()}", "--model", f"tiny={HYBRID / 'qwen35.gguf'}",
                              "--model", f"next={HYBRID / 'qwen3next.gguf'}", "--preload", "next",
                              "--idle-unload-s", str(IDLE_S), "--device", "cpu", "--ctx", "512"]) as s:
        yield s


def listing(server) -> dict[str, str]:
    return {m["id"]: m["status"] for m in httpx.get(server.url + "/v1/models").json()["data"]}


def until(predicate, timeout_s: float = 30.0) -> None:
    end = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.1)


def test_models_answer_by_name_load_on_demand_and_unload_when_idle(server):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    until(lambda: listing(server)["next"] == "loaded")  # --preload: loading from the start
    assert listing(server) == {"smol": "loaded", "tiny": "unloaded", "next": "loaded"}
    ask = dict(prompt="Hello there, general Kenobi", max_tokens=3, temperature=0)
    tiny = client.completions.create(model="tiny", **ask)
    assert listing(server)["tiny"] == "loaded"
    smol = client.completions.create(model="smol", **ask)
    unnamed = httpx.post(server.url + "/v1/completions", json=ask, timeout=60).json()  # no model: the first
    assert tiny.usage.prompt_tokens != smol.usage.prompt_tokens  # two tokenizers: two models
    assert (tiny.model, smol.model, unnamed["model"]) == ("tiny", "smol", "smol")
    assert unnamed["choices"][0]["text"] == smol.choices[0].text
    assert [m["id"] for m in httpx.get(server.url + "/status").json()["models"]] == ["smol", "tiny", "next"]
    scraped = {(f.name, s.labels.get("model")): s.value for f in text_string_to_metric_families(
        httpx.get(server.url + "/metrics").text) for s in f.samples if s.name == "strata_generated_tokens_total"}
    assert scraped[("strata_generated_tokens", "tiny")] == 3 and scraped[("strata_generated_tokens", "smol")] == 6
    assert scraped[("strata_generated_tokens", "next")] == 0  # every loaded model's, each family once
    until(lambda: listing(server)["tiny"] == "unloaded", timeout_s=IDLE_S + 20)
    assert listing(server) == {"smol": "loaded", "tiny": "unloaded", "next": "loaded"}  # the kept ones stay
    again = client.completions.create(model="tiny", **ask)
    assert again.choices[0].text == tiny.choices[0].text


def test_an_unknown_model_is_a_404_naming_the_models(server):
    chat = httpx.post(server.url + "/v1/chat/completions",
                      json={"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]})
    assert chat.status_code == 404 and chat.json()["error"]["code"] == "model_not_found"
    assert "smol, tiny, next" in chat.json()["error"]["message"]
    anthropic = httpx.post(server.url + "/v1/messages",
                           json={"model": "claude-x", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]})
    assert anthropic.status_code == 404 and anthropic.json()["error"]["type"] == "not_found_error"


def test_the_live_view_watches_a_loaded_model_by_name_and_loads_none(server):
    """/v1/events?model=: a loaded model's own engines and counters (the page's live view follows the model
    chosen); a model not loaded is a 409 and stays unloaded (watching is not a use); an unknown one a 404."""
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    until(lambda: listing(server)["next"] == "loaded")
    client.completions.create(model="next", prompt="Hello there", max_tokens=2, temperature=0)
    watched, first = state_events(server.url, 0, model="next")[0][1], state_events(server.url, 0)[0][1]
    assert watched["engines"] and watched["totals"]["generated_tokens"] == 2  # next's own counters, not the first's
    assert first["totals"]["generated_tokens"] != 2
    until(lambda: listing(server)["tiny"] == "unloaded", timeout_s=IDLE_S + 20)
    refused = httpx.get(server.url + "/v1/events?model=tiny", timeout=10)
    assert refused.status_code == 409 and refused.json()["error"]["code"] == "model_not_loaded"
    assert listing(server)["tiny"] == "unloaded"
    assert httpx.get(server.url + "/v1/events?model=gpt-4o", timeout=10).status_code == 404


def fake_entry(name: str, used: float, busy: bool = False, kept: bool = False) -> model_set.ModelEntry:
    stopped = []

    async def stop():
        stopped.append(name)

    scheduler = SimpleNamespace(waiting=[1] if busy else [], running=[], parked=[])
    entry = model_set.ModelEntry(name, Path(name), kept=kept, last_used=used)
    entry.state = SimpleNamespace(scheduler=scheduler, stop=stop, stopped=stopped)
    return entry


def test_a_load_unloads_the_least_recently_used_idle_model_else_says_what_is_loaded(monkeypatch):
    settings = ServerSettings(model_path=Path("first.gguf"))
    models = model_set.ModelSet.__new__(model_set.ModelSet)
    models.settings = settings
    first, old, newer, busy = (fake_entry("first", 0, kept=True), fake_entry("old", 1), fake_entry("newer", 2),
                               fake_entry("busy", 0, busy=True))
    models.entries = {e.name: e for e in (first, old, newer, busy)}
    gib = model_set.GIB
    monkeypatch.setattr(ServerSettings, "memory_need", lambda self, path: 3 * gib)
    left = iter([2 * gib, 4 * gib])  # the room left before and after one unload
    monkeypatch.setattr(model_set, "available_memory", lambda: next(left))
    asyncio.run(models._make_room(model_set.ModelEntry("new", Path("new"))))
    assert old.state is None and newer.state is not None  # the least recently used idle model went
    monkeypatch.setattr(model_set, "available_memory", lambda: 1 * gib)
    with pytest.raises(APIError) as refused:
        asyncio.run(models._make_room(model_set.ModelEntry("big", Path("big"))))
    assert refused.value.status == 503 and newer.state is None
    assert refused.value.message == ("the model 'big' needs about 3.0 GiB (its weights and KV pool) and 1.0 GiB is "
                                     "left; loaded: first (kept), busy (busy)")


def test_on_a_gpu_a_load_is_set_against_the_card_s_free_memory(monkeypatch, tmp_path):
    """A GPU engine needs --gpu-memory where given, else its file and the least room it starts with; the card's
    free memory decides, and the refusal says that an engine takes the card unless capped."""
    weights = tmp_path / "m.gguf"
    weights.write_bytes(b"\0" * 4096)
    gib = model_set.GIB
    assert ServerSettings(model_path=weights, device="gpu").memory_need(weights) == 4096 + 2 * gib
    assert ServerSettings(model_path=weights, device="gpu", gpu_memory_gib=20).memory_need(weights) == 20 * gib
    settings = ServerSettings(model_path=Path("first.gguf"), device="gpu", gpu_memory_gib=20)
    models = model_set.ModelSet.__new__(model_set.ModelSet)
    models.settings = settings
    first, idle = fake_entry("first", 0), fake_entry("idle", 1)
    models.entries = {e.name: e for e in (first, idle)}
    free = iter([8 * gib, 30 * gib])
    monkeypatch.setattr(model_set, "gpu_free_memory", lambda gpus: next(free))
    monkeypatch.setattr(model_set, "available_memory", lambda: 0)  # (the host's is not what counts here)
    asyncio.run(models._make_room(model_set.ModelEntry("new", Path("new"))))
    assert first.state is None and idle.state is not None  # the least recently used went; then 30 GiB were free
    monkeypatch.setattr(model_set, "gpu_free_memory", lambda gpus: 8 * gib)
    idle.state.scheduler.waiting = [1]  # busy now
    with pytest.raises(APIError) as refused:
        asyncio.run(models._make_room(model_set.ModelEntry("big", Path("big"))))
    assert refused.value.status == 503 and "20.0 GiB of GPU memory" in refused.value.message
    assert "unless --gpu-memory caps it" in refused.value.message and "idle (busy)" in refused.value.message
