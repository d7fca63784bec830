"""The IQ quant types on the CPU (issue 45): the engine's weights of each IQ type's blocks (random grid
indices, signs and sub-scales, as tools/fixtures/make_synthetic_gguf.py writes them) are gguf-py's
dequantization (the reference arithmetic); and a hybrid file of the common types (IQ3_S, IQ4_XS) loads
with each layer matrix so, in the forward pass's layout, and a prompt read gives finite logits."""
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
