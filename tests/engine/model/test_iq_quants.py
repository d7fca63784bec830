"""The IQ quant types on the CPU (issue 45): the engine's weights of each IQ type's blocks (random grid
indices, signs and sub-scales, as tools/fixtures/make_synthetic_gguf.py writes them) are gguf-py's
dequantization (the reference arithmetic); and a hybrid file of the common types (IQ3_S, IQ4_XS) loads
with each layer matrix so, in the forward pass's layout, and a prompt read gives finite logits."""
import hashlib
import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFReader
from gguf.quants import dequantize

from engine.kvcache.recurrent import SequenceState
from engine.model.weights import TensorRows, load_model
from engine.ops.backend import cpu_backend
from engine.runner.runner import ModelRunner
from tools.fixtures.make_synthetic_gguf import random_blocks

ROOT = Path(__file__).resolve().parents[3]
TYPES = ("IQ1_S", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ4_NL", "IQ4_XS")
SHAPE = ["--arch", "qwen3next", "--layers", "2", "--dim", "256", "--heads", "2", "--kv-heads", "1", "--head-dim", "128",
         "--experts", "2", "--experts-used", "1", "--expert-ffn", "256", "--shared-ffn", "256", "--interval", "2",
         "--rope-dim", "32", "--conv-kernel", "4", "--linear-k-heads", "2", "--linear-v-heads", "4", "--linear-dk", "64",
         "--linear-dv", "64", "--ctx", "1024", "--tied"]


@pytest.mark.parametrize("kind", TYPES)
def test_each_iq_type_s_rows_are_gguf_s_values(kind):
    """A matrix of 3 rows of 512 values of random blocks, through the loader's rows (TensorRows.values)."""
    qtype = GGMLQuantizationType[kind]
    raw = random_blocks(np.random.default_rng(1), qtype, 3, 512, 0.02)
    tensor = SimpleNamespace(name="w", tensor_type=qtype, data=raw, shape=(512, 3))
    want = dequantize(raw.reshape(-1), qtype).reshape(3, 512)
    assert np.array_equal(TensorRows(tensor).values(), want) and np.isfinite(want).all() and want.std() > 0


@pytest.mark.parametrize("kind", ["IQ3_S", "IQ4_XS"])
def test_an_iq_file_loads_as_gguf_dequantizes_it_and_reads(kind, tmp_path):
    path = tmp_path / f"{kind}.gguf"
    subprocess.run([sys.executable, str(ROOT / "tools/fixtures/make_synthetic_gguf.py"), str(path), *SHAPE,
                    "--type", kind], check=True, capture_output=True)
    tensors = {t.name: t for t in GGUFReader(path).tensors}

    def values(name):
        t = tensors[name]
        assert t.tensor_type == GGMLQuantizationType[kind], (name, t.tensor_type)
        return dequantize(np.asarray(t.data), t.tensor_type).reshape(-1, int(t.shape[0]))

    backend = cpu_backend()
    cfg, weights, _ = load_model(str(path), backend)
    linear, attention = weights.layers[0], weights.layers[1]
    assert np.array_equal(linear.linear.w_in[: 2 * 2 * 64 + 4 * 64], values("blk.0.attn_qkv.weight"))
    assert np.array_equal(linear.linear.w_out, values("blk.0.ssm_out.weight"))
    assert np.array_equal(attention.wo, values("blk.1.attn_output.weight"))
    assert np.array_equal(weights.tok_embd, values("token_embd.weight"))
    runner = ModelRunner(cfg, weights, backend, ctx=256, chunk=64, eos_ids=frozenset())
    state = SequenceState.fresh(runner.recurrent)
    logits = np.array(runner.forward(np.arange(100, 170), 0, list(range(2)), True, state=state))
    assert logits.shape == (cfg.vocab_size,) and np.isfinite(logits).all() and logits.std() > 0


IQ_FIXTURES = ROOT / "tests/fixtures/iq"
# a quantization's error on this random model, measured: the largest probe's distance in the F16 logits' spread
# 0.108 (IQ4_XS) and 0.176 (IQ3_S), their correlation with the F16 logits 0.987 and 0.967 (the engine on the F16
# file: 2.3e-4 of the spread from llama.cpp's); a row layout gone wrong leaves no correlation
QUANTIZATION_ERROR = {"IQ4_XS": (0.15, 0.95), "IQ3_S": (0.25, 0.9)}  # (largest error, least correlation)


def read_prompt(path: Path, ids: list[int]) -> np.ndarray:
    backend = cpu_backend()
    cfg, weights, _ = load_model(str(path), backend)
    runner = ModelRunner(cfg, weights, backend, ctx=256, chunk=64, eos_ids=frozenset())
    state = SequenceState.fresh(runner.recurrent)
    return np.array(runner.forward(np.asarray(ids), 0, list(range(2)), True, state=state))


@pytest.mark.parametrize("kind", ["IQ4_XS", "IQ3_S"])
def test_llama_cpp_s_own_iq_files_read_as_gguf_dequantizes_them_near_its_f16_logits(kind):
    """Files llama.cpp's quantizer made from one F16 qwen3next (tools/fixtures/make_iq_fixture.py): every IQ tensor
    of the file is present as gguf-py's dequantization, and the logits stay within a quantization's error of
    llama.cpp's own on the F16 file (llama.cpp's CPU build crashes on its IQ files here, so its F16 logits are
    the reference)."""
    golden = json.loads((IQ_FIXTURES / "iq_golden.json").read_text())
    spec = golden["files"][kind]
    path = IQ_FIXTURES / spec["file"]
    assert hashlib.sha256(path.read_bytes()).hexdigest() == spec["sha256"], "the fixture's file changed"
    iq = [t for t in GGUFReader(path).tensors if t.tensor_type.name.startswith("IQ")]
    assert {t.tensor_type.name for t in iq} >= {kind} and len(iq) >= 8
    for t in iq:
        assert np.array_equal(TensorRows(t).values(), dequantize(np.asarray(t.data), t.tensor_type).reshape(
            -1, int(t.shape[0]))), t.name
    logits = read_prompt(path, golden["prompt"])[golden["probes"]]
    want = np.asarray(golden["f16_llama_cpp"]["probe_logits"])
    error, correlation = float(np.abs(logits - want).max() / (want.max() - want.min())), np.corrcoef(logits, want)[0, 1]
    bound, least = QUANTIZATION_ERROR[kind]
    assert error < bound and correlation > least, (error, correlation)
