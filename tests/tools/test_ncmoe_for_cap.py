"""tools/device/ncmoe_for_cap.py: llama.cpp's --n-cpu-moe for a GPU memory cap, read from a real file's tensors (a
small synthetic Qwen3-MoE made by tools/fixtures/make_synthetic_gguf.py)."""
import subprocess
import sys
from pathlib import Path

import pytest

from tools.device.ncmoe_for_cap import layer_expert_bytes, n_cpu_moe

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def moe_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("moe") / "moe.gguf"
    subprocess.run([sys.executable, str(ROOT / "tools/fixtures/make_synthetic_gguf.py"), str(path), "--arch",
                    "qwen3moe", "--layers", "4", "--dim", "256", "--ffn", "512", "--heads", "4", "--kv-heads", "2",
                    "--head-dim", "64", "--experts", "16", "--experts-used", "4", "--expert-ffn", "256", "--ctx", "512",
                    "--type", "Q4_K_M"],
                   check=True, capture_output=True)
    return path


def test_the_fewest_layers_whose_experts_leave_the_rest_within_the_cap(moe_file):
    total, per_layer = layer_expert_bytes(str(moe_file))
    assert sorted(per_layer) == [0, 1, 2, 3] and all(b > 0 for b in per_layer.values())
    assert n_cpu_moe(total, per_layer, total) == 0  # the whole file fits
    first = per_layer[0]
    assert n_cpu_moe(total, per_layer, total - first) == 1  # one layer's experts on the host make room
    assert n_cpu_moe(total, per_layer, total - first - 1) == 2
    dense = total - sum(per_layer.values())
    assert n_cpu_moe(total, per_layer, dense) == 4
    with pytest.raises(ValueError, match="over the cap"):
        n_cpu_moe(total, per_layer, dense - 1)
