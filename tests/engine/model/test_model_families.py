"""The families beside llama (qwen2: Q/K/V biases; qwen3: per-head Q/K norms, heads x head width
unlike the model width; qwen3moe: routed experts) against an independent reference: transformers in
float32 on the same tiny GGUFs (tests/fixtures/arch_golden.json, made by tools/fixtures/make_arch_fixture.py).
The GGUFs are made again here with the fixture's arguments, and must be the very same bytes."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

from engine.ops.backend import cpu_backend
from protocol.messages import START_REFUSED
from engine.model.weights import load_model
from engine.kvcache.kv import KVCache
from engine.model.forward import LlamaModel
from tests.harness import PY, ROOT, EngineProcess, remake_fixture_models

FIXTURE = json.loads((ROOT / "tests/fixtures/arch_golden.json").read_text())["models"]
LOGIT_TOL = 1e-4  # float32 both sides: the differences measured are ~4e-7 (logits ~0.7)


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    return remake_fixture_models(tmp_path_factory.mktemp("families"), FIXTURE, "tools/fixtures/make_arch_fixture.py")


def run(path: Path, ids: list[int], greedy: int, chunk: int = 512):
    """Last-position logits of the prompt, the greedy continuation, and the MoE routes (per layer)."""
    backend = cpu_backend()
    cfg, weights, _ = load_model(str(path), backend)
    model = LlamaModel(cfg, weights, backend)
    model.route_log = []
    kv = KVCache(cfg, 256, backend)
    logits = model.prefill(np.asarray(ids), kv, chunk)
    routes = model.route_log
    model.route_log = None
    out, cur = [], logits
    for _ in range(greedy):
        out.append(int(np.argmax(cur)))
        cur = model.forward(np.asarray(out[-1:]), len(ids) + len(out) - 1, kv, want_logits=True)
    return cfg, logits, out, routes


@pytest.mark.parametrize("family", sorted(FIXTURE))
def test_logits_and_greedy_text_equal_the_reference(models, family):
    spec = FIXTURE[family]
    for case in spec["cases"]:
        cfg, logits, greedy, _ = run(models[family], case["ids"], len(case["greedy"]))
        assert cfg.arch == family
        assert [int(i) for i in np.argsort(-logits, kind="stable")[: len(case["top_ids"])]] == case["top_ids"]
        np.testing.assert_allclose(logits[case["top_ids"]], case["top_logits"], atol=LOGIT_TOL, rtol=0)
        np.testing.assert_allclose(logits[spec["probe_ids"]], case["probe_logits"], atol=LOGIT_TOL, rtol=0)
        assert greedy == case["greedy"]


def test_the_families_differ_where_the_config_says(models):
    """What each family adds is read from the file: a qwen3 head is 64 wide under a model width of
    128 with 4 heads; qwen2 has biases; qwen3moe routes to 3 of 8 experts."""
    configs = {f: load_model(str(p), cpu_backend())[:2] for f, p in models.items()}
    cfg, weights = configs["qwen3"]
    assert (cfg.dim, cfg.n_heads, cfg.head_dim, cfg.q_dim) == (128, 4, 64, 256) and cfg.qk_norm
    assert weights.layers[0].wo.shape == (128, 256) and weights.layers[0].q_norm.shape == (64,)
    cfg, weights = configs["qwen2"]
    assert cfg.qkv_bias and weights.layers[0].bqkv.shape == (cfg.q_dim + 2 * cfg.kv_dim,)
    cfg, weights = configs["qwen3moe"]
    assert (cfg.n_experts, cfg.n_experts_used, cfg.expert_ffn_dim, cfg.expert_weights_norm) == (8, 3, 64, True)
    experts = weights.layers[0].experts
    assert (experts.gate.experts, experts.gate.rows, experts.gate.cols) == (8, 64, 128) and weights.layers[0].w_gate_up is None
    assert experts.down.data.shape == (8 * 128, 64) and experts.down.expert(7).shape == (128, 64)
    assert not any(c.rope_pairs_adjacent for c, _ in configs.values())


def test_the_router_chooses_the_references_experts_with_its_weights(models):
    """Every token of every fixture prompt, every layer: the same experts in the same order, the
    same (normalized) weights."""
    for case in FIXTURE["qwen3moe"]["cases"]:
        _, _, _, routes = run(models["qwen3moe"], case["ids"], 0)
        assert [layer for layer, _, _ in routes] == [r["layer"] for r in case["routes"]]
        for (_, experts, weights), ref in zip(routes, case["routes"]):
            assert experts.tolist() == ref["experts"]
            np.testing.assert_allclose(weights, ref["weights"], atol=1e-5, rtol=0)
            np.testing.assert_allclose(weights.sum(axis=1), 1.0, atol=1e-5)


def test_a_prompt_read_in_chunks_gives_the_logits_read_whole(models):
    """The experts take a chunk's tokens grouped by expert; chunk boundaries must not change them."""
    ids = FIXTURE["qwen3moe"]["cases"][1]["ids"] * 3
    _, whole, _, _ = run(models["qwen3moe"], ids, 0, chunk=512)
    _, chunked, _, _ = run(models["qwen3moe"], ids, 0, chunk=5)
    np.testing.assert_allclose(chunked, whole, atol=1e-5, rtol=0)


def test_a_qwen3moe_read_parked_and_resumed_gives_the_uninterrupted_tokens_and_state(models):
    """Park/resume parity on a MoE model through the real engine process: tokens and the state
    fingerprint equal the uninterrupted run's. The tiny model reads a chunk in about a millisecond,
    so the park is offered with the request itself: A parks at the first boundary it reaches."""
    from protocol import messages as m
    from tools.checks import preempt_scenarios as sc

    chunk, prompt = 16, (FIXTURE["qwen3moe"]["cases"][1]["ids"] * 9)[:100]
    engine = EngineProcess([PY, "-m", "engine", "--serve", "--device", "cpu", "--model", str(models["qwen3moe"]),
                            "--ctx", "256", "--chunk", str(chunk), "--prefill-preempt", "--prefill-preempt-min-tokens", "0"])
    try:
        assert "preempt" in engine.handshake().caps
        for params in ({"temperature": 0.0, "seed": 0}, {"temperature": 0.9, "top_p": 0.95, "seed": 7}):
            reference = sc.uninterrupted(engine, prompt, 8, params)
            engine.send(sc.gen(prompt, 8, params, sc.A))
            engine.send(m.Yield())
            seen = engine.read_until(m.Suspended, ident=sc.A)
            parked_at = seen[-1].done
            park_fp = next(x.digest for x in seen if isinstance(x, m.Fingerprint) and x.stage == "park")
            sc.run_interim(engine, FIXTURE["qwen3moe"]["cases"][0]["ids"], 3, params)  # B uses the experts too
            engine.send(m.Resume(sc.A))
            seen += engine.read_until(m.Fingerprint, ident=sc.A)
            assert 0 < parked_at < len(prompt) and parked_at % chunk == 0
            assert seen[-1].digest == park_fp  # the restore put back exactly what was parked
            out = sc.finish_a(engine, seen, sc.Outcome([], ""))
            assert (out.tokens, out.done_fp) == (reference.tokens, reference.done_fp)
    finally:
        engine.close()


def test_an_unknown_architecture_is_still_refused_by_name(tmp_path):
    """Only the families above load; any other is named in the error (not approximated)."""
    from gguf import GGUFWriter

    path = tmp_path / "other.gguf"
    w = GGUFWriter(str(path), "qwen2moe")
    w.add_block_count(1)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()
    out = subprocess.run([PY, "-m", "engine", "--serve", "--device", "cpu", "--model", str(path)], input="QUIT\n",
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == START_REFUSED and "unsupported architecture 'qwen2moe'" in out.stderr
    assert "qwen3moe" in out.stderr  # the supported ones are listed
