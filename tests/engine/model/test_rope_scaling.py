"""Long-context rope scaling against an independent reference: Llama 3.1's per-frequency factors
(the rope_freqs tensor) and YaRN (the rope.scaling keys) on tiny GGUFs, at positions up to three
times past the original context, against transformers in float32 given the checkpoint's
rope_scaling (tests/fixtures/rope_golden.json, made by tools/fixtures/make_rope_fixture.py). Also: without
the scaling the same prompts come out far from the reference (the check can fail), and the
command line's overrides reach the tables."""
from __future__ import annotations

import json
import math
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from engine.ops.backend import cpu_backend
from engine.cli import build_parser, config_from_args
from engine.model.weights import load_model
from engine.kvcache.kv import KVCache
from engine.model.forward import LlamaModel
from engine.modelfile.rope_config import RopeOverride, RopeScaling
from engine.model.rope import frequencies, yarn_range
from serve.config import ServerSettings
from tests.harness import ROOT, remake_fixture_models

FIXTURE = json.loads((ROOT / "tests/fixtures/rope_golden.json").read_text())["models"]
LOGIT_TOL = 2e-4  # float32 both sides; the angles are float64 here and float32 in transformers


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    return remake_fixture_models(tmp_path_factory.mktemp("rope"), FIXTURE, "tools/fixtures/make_rope_fixture.py")


def run(path: Path, ids: list[int], greedy: int, rope: RopeScaling | None = None):
    """Last-position logits of the prompt (read in chunks of 64) and the greedy continuation;
    `rope` replaces the file's scaling."""
    backend = cpu_backend()
    cfg, weights, _ = load_model(str(path), backend)
    cfg = cfg if rope is None else replace(cfg, rope=rope)
    model = LlamaModel(cfg, weights, backend)
    kv = KVCache(cfg, 256, backend)
    logits = model.prefill(np.asarray(ids), kv, 64)
    out, cur = [], logits
    for _ in range(greedy):
        out.append(int(np.argmax(cur)))
        cur = model.forward(np.asarray(out[-1:]), len(ids) + len(out) - 1, kv, want_logits=True)
    return cfg, logits, out


@pytest.mark.parametrize("name", sorted(FIXTURE))
def test_logits_and_greedy_text_equal_the_reference_past_the_original_context(models, name):
    spec = FIXTURE[name]
    for case in spec["cases"]:
        cfg, logits, greedy = run(models[name], case["ids"], len(case["greedy"]))
        assert cfg.rope.active
        assert [int(i) for i in np.argsort(-logits, kind="stable")[: len(case["top_ids"])]] == case["top_ids"]
        np.testing.assert_allclose(logits[case["top_ids"]], case["top_logits"], atol=LOGIT_TOL, rtol=0)
        np.testing.assert_allclose(logits[spec["probe_ids"]], case["probe_logits"], atol=LOGIT_TOL, rtol=0)
        assert greedy == case["greedy"]


@pytest.mark.parametrize("name", sorted(FIXTURE))
def test_without_the_scaling_the_long_prompt_is_far_from_the_reference(models, name):
    case = FIXTURE[name]["cases"][-1]  # 200 tokens, three times the original context
    _, logits, _ = run(models[name], case["ids"], 0, rope=RopeScaling())
    assert np.max(np.abs(logits[case["top_ids"]] - case["top_logits"])) > 50 * LOGIT_TOL


def test_the_files_scaling_is_read(models):
    llama = load_model(str(models["llama3"]), cpu_backend())[0]
    assert llama.rope.kind == "none" and len(llama.rope.freq_factors) == llama.head_dim // 2
    assert llama.rope.freq_factors[0] == 1.0 and llama.rope.freq_factors[-1] == 8.0  # high frequencies kept
    qwen = load_model(str(models["qwen2-yarn"]), cpu_backend())[0]
    assert (qwen.rope.kind, qwen.rope.scale, qwen.rope.original_ctx, qwen.max_context) == ("yarn", 4.0, 64, 256)


def test_yarn_keeps_fast_pairs_interpolates_slow_ones_and_scales_the_magnitude():
    scaling = RopeScaling("yarn", 4.0, original_ctx=64)
    plain, _ = frequencies(64, 10000.0, RopeScaling())
    inv, mscale = frequencies(64, 10000.0, scaling)
    low, high = yarn_range(64, 10000.0, scaling)
    assert 0 <= low < high <= 63
    assert np.array_equal(inv[: int(low)], plain[: int(low)])  # many turns over the original context: kept
    np.testing.assert_allclose(inv[int(high):], plain[int(high):] / 4)  # few: interpolated
    assert mscale == pytest.approx(1 + 0.1 * math.log(4))
    linear, one = frequencies(64, 10000.0, RopeScaling("linear", 2.0))
    np.testing.assert_allclose(linear, plain / 2)
    assert one == 1.0


def test_overrides_from_the_command_line_reach_the_model(models):
    args = build_parser().parse_args(["--rope-scaling", "linear", "--rope-scale", "2", "--rope-freq-base", "20000"])
    override = config_from_args(args).rope
    assert override == RopeOverride("linear", 2.0, 20000.0, None)
    cfg = load_model(str(models["qwen2-yarn"]), cpu_backend(), rope=override)[0]
    assert (cfg.rope.kind, cfg.rope.scale, cfg.rope_base) == ("linear", 2.0, 20000.0)
    server = ServerSettings(model_path=models["qwen2-yarn"], rope=override).engine_command()
    assert server[-6:] == ["--rope-scaling", "linear", "--rope-scale", "2", "--rope-freq-base", "20000"]


@pytest.mark.parametrize("argv, message", [(["--rope-scale", "0"], "--rope-scale must be > 0"),
                                           (["--yarn-orig-ctx", "0"], "--yarn-orig-ctx must be >= 1")])
def test_bad_overrides_are_refused_with_a_message(argv, message):
    run_ = subprocess.run([sys.executable, "-m", "engine", "--serve", *argv], capture_output=True, text=True, timeout=60)
    assert run_.returncode == 2 and message in run_.stderr
