"""A Qwen3-MoE GGUF served as a user would (`make serve ARGS="--model FILE"`): strata-server over the
real engine, with the file's own chat template, answering what the model computes in process; its routed experts
behind a cache of a few slots (--expert-slots) giving the same text, the cache's counts in /metrics, /status and
the page's live view."""
from __future__ import annotations

import subprocess
import sys

import httpx
import numpy as np
import openai
import pytest

from engine.ops.backend import cpu_backend
from engine.model.weights import load_model
from engine.kvcache.kv import KVCache
from engine.model.forward import LlamaModel
from engine.modelfile.tokenizer import load_tokenizer
from tests.harness import ROOT, ServerProcess
from tests.serve.browser import chromium, console_errors, wait_until
from tests.serve.helpers import metrics

PROMPT = [9745, 198, 378, 28518, 216, 260, 216, 3201, 9649, 4521, 17, 99]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = tmp_path_factory.mktemp("moe") / "qwen3moe-tiny.gguf"
    subprocess.run([sys.executable, str(ROOT / "tools/fixtures/make_synthetic_gguf.py"), str(path), "--arch", "qwen3moe",
                    "--layers", "2", "--dim", "128", "--heads", "4", "--kv-heads", "2", "--head-dim", "64",
                    "--experts", "8", "--experts-used", "2", "--expert-ffn", "64", "--ctx", "512", "--type", "Q8_0",
                    "--seed", "5", "--chat-template", str(ROOT / "tests/fixtures/templates/Qwen-Qwen3-0.6B.jinja")],
                   check=True, capture_output=True)
    return path


def in_process_greedy(path, ids: list[int], n: int) -> list[int]:
    backend = cpu_backend()
    cfg, weights, _ = load_model(str(path), backend)
    m, kv = LlamaModel(cfg, weights, backend), KVCache(cfg, 512, backend)
    logits, out = m.prefill(np.asarray(ids), kv, 256), []
    for _ in range(n):
        out.append(int(np.argmax(logits)))
        logits = m.forward(np.asarray(out[-1:]), len(ids) + len(out) - 1, kv, want_logits=True)
    return out


EXPERT_BYTES = 3 * 64 * 128 * 4  # one expert's gate, up and down on the CPU (float32 values)


def test_a_qwen3moe_model_serves_what_it_computes_through_an_expert_cache(model):
    """With 3 slots a layer for 8 experts (2 a token) every step copies some in: the same text as every expert
    resident in process, and the cache's counts where a user looks."""
    with ServerProcess(extra=["--model", str(model), "--device", "cpu", "--ctx", "512", "--chunk", "8",
                              "--expert-slots", "3"]) as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
        r = client.completions.create(model="qwen3moe-tiny", prompt=PROMPT, temperature=0, max_tokens=8)
        n = r.usage.completion_tokens
        assert r.usage.prompt_tokens == len(PROMPT) and 0 < n <= 8
        assert r.choices[0].text == load_tokenizer(str(model)).decode(in_process_greedy(model, PROMPT, n))
        chat = client.chat.completions.create(model="qwen3moe-tiny", messages=[{"role": "user", "content": "Hi"}],
                                              max_tokens=4, temperature=0,
                                              extra_body={"chat_template_kwargs": {"enable_thinking": False}})
        assert chat.choices[0].finish_reason in ("stop", "length") and chat.usage.completion_tokens <= 4
        assert [m.id for m in client.models.list().data] == ["qwen3moe-tiny"]
        cache = wait_until(lambda: httpx.get(server.url + "/status").json()["kv"].get("expert_cache"),
                           what="the cache's counts")
        seen = metrics(server.url)
        assert cache["slots"] == 6 and cache["layers"] == 2 and cache["misses"] > 0 and cache["hits"] > 0
        assert cache["bytes_copied"] == cache["misses"] * EXPERT_BYTES and cache["tokens"] >= len(PROMPT) + n - 1
        assert seen["strata_expert_cache_slots"] == 6
        assert seen["strata_expert_cache_copied_bytes_total"] == seen["strata_expert_cache_misses_total"] * EXPERT_BYTES
        assert seen["strata_expert_cache_misses_total"] >= cache["misses"] > 0  # (the report may have moved on since)
        with chromium() as driver:
            driver.get(server.url + "/")
            shown = wait_until(lambda: driver.find_element("id", "expert-text").text, what="the expert cache's row")
            assert "% hits" in shown and "copied a token" in shown and "3 slots a layer × 2 layers" in shown, shown
            assert console_errors(driver) == []


HYBRID = ROOT / "tests/fixtures/hybrid"


@pytest.mark.parametrize("family", ["qwen3next", "qwen35moe"])
def test_a_hybrid_model_serves_transformers_greedy_tokens_and_reuses_a_conversation(family):
    """The tiny Qwen3-Next / Qwen3.5-MoE conversions of tests/fixtures/hybrid served as a user would: the
    greedy text transformers computed, and a conversation's next turn reads only what is new."""
    golden = __import__("json").loads((HYBRID / "hybrid_golden.json").read_text())["models"][family]
    case = next(c for c in golden["cases"] if len(c["ids"]) > 100)
    path = HYBRID / golden["file"]
    with ServerProcess(extra=["--model", str(path), "--device", "cpu", "--ctx", "1024"]) as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
        r = client.completions.create(model=family, prompt=case["ids"], temperature=0, max_tokens=8,
                                      extra_body={"ignore_eos": True})
        assert r.choices[0].text == load_tokenizer(str(path)).decode(case["greedy"][: r.usage.completion_tokens])
        assert r.usage.completion_tokens == 8 or r.choices[0].finish_reason == "stop"
        messages = [{"role": "user", "content": "Tell me about the lighthouse keeper. " * 12}]
        first = client.chat.completions.create(model=family, messages=messages, max_tokens=16, temperature=0)
        messages += [{"role": "assistant", "content": first.choices[0].message.content},
                     {"role": "user", "content": "And then?"}]
        second = client.chat.completions.create(model=family, messages=messages, max_tokens=4, temperature=0)
        reused = second.usage.prompt_tokens_details.cached_tokens
        assert reused >= first.usage.prompt_tokens // 64 * 64 > 0, (reused, first.usage.prompt_tokens)
