"""Tensor parallelism's split (engine/parallel/tensor_parallel.py), both shards in one process: the ranks'
forward with their partials all-reduced computes what the whole model computes (float32 on the CPU:
the same logits within summation order, the same greedy tokens), on the real default model (3 ranks:
its 9 heads, 3 K/V heads and 1,536 hidden units split in three) and on the qwen2 and qwen3 fixtures
(2 ranks: Q/K/V biases and per-head norms split with their heads), those also against transformers'
logits (tests/fixtures/arch_golden.json)."""
from __future__ import annotations

import json

import numpy as np
import pytest

from engine.ops.backend import cpu_backend
from engine.modelfile.model_config import ModelLoadError
from engine.model.weights import load_model
from engine.kvcache.kv import KVCache
from engine.model.forward import LlamaModel
from engine.parallel.tensor_parallel import TensorParallelModel, rank_sum, shard_config
from tests.harness import ROOT, remake_fixture_models
from tools.fixtures.make_synthetic_gguf import main as make_synthetic
from tools.checks.tp_check import run as greedy_run  # (prompt logits read in chunks, the greedy tokens, seconds)

FIXTURE = json.loads((ROOT / "tests/fixtures/arch_golden.json").read_text())["models"]


def compare(path: str, world: int, ids: list[int], steps: int = 8, chunk: int = 5):
    backend = cpu_backend()
    cfg, weights, _ = load_model(path, backend)
    whole = LlamaModel(cfg, weights, backend)
    split = TensorParallelModel(cfg, weights, [backend] * world)  # NumPy ops keep no state: one backend serves all
    ref_logits, ref_tokens, _ = greedy_run(whole.forward, KVCache(cfg, 256, backend), np.asarray(ids), steps, chunk)
    tp_logits, tp_tokens, _ = greedy_run(split.forward, split.make_caches(256), np.asarray(ids), steps, chunk)
    scale = np.abs(ref_logits).max()
    assert np.abs(tp_logits - ref_logits).max() <= 1e-4 * scale
    assert tp_tokens == ref_tokens
    return split, tp_logits


def test_three_ranks_of_the_default_model_compute_the_whole_model(model_path, tokenizer):
    ids = tokenizer.encode("The capital of France is Paris. The capital of Italy is")
    split, _ = compare(model_path, 3, ids)
    assert (split.cfg.n_heads, split.cfg.n_kv_heads, split.cfg.ffn_dim) == (3, 1, 512)
    assert split.ranks[0].w.layers[0].wqkv.shape == ((3 + 2) * 64, 576)  # its 3 query heads, 1 K and 1 V head


@pytest.fixture(scope="module")
def families(tmp_path_factory):
    wanted = {k: FIXTURE[k] for k in ("qwen2", "qwen3")}
    return remake_fixture_models(tmp_path_factory.mktemp("tp"), wanted, "tools/fixtures/make_arch_fixture.py")


@pytest.mark.parametrize("family", ["qwen2", "qwen3"])
def test_two_ranks_of_the_families_compute_their_reference(families, family):
    case = FIXTURE[family]["cases"][0]
    _, logits = compare(str(families[family]), 2, case["ids"], steps=len(case["greedy"]))
    np.testing.assert_allclose(logits[case["top_ids"]], case["top_logits"], atol=1e-4, rtol=0)


def test_fp16_partials_are_summed_in_fp32_and_rounded_once():
    """2048 + 1 + 1 in fp16 one addition at a time is 2048 (the spacing there is 2, each 2049 rounds to
    even); the ranks' total is the fp32 sum rounded once: 2050, in the partials' type."""
    parts = [np.full(3, v, dtype=np.float16) for v in (2048.0, 1.0, 1.0)]
    total = rank_sum(parts)
    assert total.dtype == np.float16
    assert total.tolist() == [2050.0] * 3
    assert parts[0].tolist() == [2048.0] * 3  # the partials are left as they were
    wide = [np.arange(4, dtype=np.float32) * (r + 1) for r in range(3)]
    assert rank_sum(wide).tolist() == ((wide[0] + wide[1]) + wide[2]).tolist()  # fp32: rank order, as before


def test_a_split_that_does_not_divide_is_refused(model_path):
    cfg, _, _ = load_model(model_path, cpu_backend())
    with pytest.raises(ModelLoadError, match="9 query heads do not split evenly"):
        shard_config(cfg, 2)


def blocks_and_dense(path: str):
    """The first layer's weights twice: in GGUF blocks as the GPU keeps them (QuantMatrix on the host)
    and dense float32 as the CPU does, stacked and reordered by the loader's own code."""
    from engine.model.weights import LayerWeights, TensorRows, WeightLoader
    from engine.modelfile.gguf_file import GGUFFile  # the engine's reader (gguf.GGUFReader's values, ~10x faster)
    from engine.modelfile.model_config import read_config
    from engine.core.quantized import stack_rows

    reader = GGUFFile(path)
    cfg = read_config(reader)
    loader = WeightLoader(reader, cfg, cpu_backend())
    p = "blk.0."
    stacks = {"wqkv": (("attn_q", cfg.n_heads), ("attn_k", cfg.n_kv_heads), ("attn_v", None)),
              "wo": (("attn_output", None),), "w_gate_up": (("ffn_gate", None), ("ffn_up", None)),
              "w_down": (("ffn_down", None),)}
    forms = {}
    for form in ("blocks", "dense"):
        fields = {}
        for field, pieces in stacks.items():
            rows = [TensorRows(loader.tensor(f"{p}{name}.weight"), heads=heads) for name, heads in pieces]
            fields[field] = (stack_rows([r.host_rows() for r in rows], np.concatenate) if form == "blocks"
                             else np.concatenate([r.dense(loader) for r in rows]))
        forms[form] = LayerWeights(attn_norm=None, ffn_norm=None, **fields)
    return cfg, forms


@pytest.mark.parametrize("which, world", [("default", 3), ("q4_k_m", 2)])
def test_quantized_weights_split_as_their_values(which, world, model_path, tmp_path):
    """The split of weights kept in their blocks (rows of blocks; columns on block boundaries),
    dequantized, is the split of the dense weights: Q4_1 (the default model's layers) and Q4_K / Q6_K."""
    from engine.model.weights import Weights
    from engine.parallel.tensor_parallel import shard_weights
    from tests.engine.core.test_quantized import expand

    path = str(model_path)
    if which == "q4_k_m":
        path = str(tmp_path / "q4_k_m.gguf")
        make_synthetic([path, "--layers", "1", "--dim", "512", "--ffn", "1024", "--heads", "4", "--kv-heads", "2",
                        "--ctx", "256", "--type", "Q4_K_M"])
    cfg, forms = blocks_and_dense(path)
    kinds = set()
    for rank in range(world):
        shards = {form: shard_weights(cfg, Weights(None, [layer], None, None), rank, world).layers[0]
                  for form, layer in forms.items()}
        for field in ("wqkv", "wo", "w_gate_up", "w_down"):
            blocks, dense = getattr(shards["blocks"], field), getattr(shards["dense"], field)
            kinds |= {part.kind for part in blocks.parts}
            np.testing.assert_array_equal(expand(blocks), dense, err_msg=f"rank {rank} {field}")
    assert kinds == ({"Q4_1"} if which == "default" else {"Q4_K", "Q6_K"})  # the default's layers: Q4_1


def test_a_column_split_inside_a_block_is_refused(tmp_path):
    from engine.model.weights import Weights
    from engine.parallel.tensor_parallel import shard_weights

    path = str(tmp_path / "q4_k.gguf")  # wo's 256 columns in one Q4_K block: two ranks would cut it
    make_synthetic([path, "--layers", "1", "--dim", "256", "--ffn", "512", "--heads", "4", "--kv-heads", "2",
                    "--ctx", "256", "--type", "Q4_K_M"])
    cfg, forms = blocks_and_dense(path)
    with pytest.raises(ModelLoadError, match="cut Q4_K's blocks of 256 values"):
        shard_weights(cfg, Weights(None, [forms["blocks"]], None, None), 0, 2)


class HostKernels:
    """The kernels the loader calls, over NumPy arrays (no device)."""

    @staticmethod
    def reserve_scratch(values: int) -> None:
        pass

    @staticmethod
    def dequantize(raw, kind: str, shape: tuple[int, int]):
        from engine.model.dequant import dequantize  # gguf's values bit for bit (test_dequant.py), ~5x faster

        return dequantize(np.ascontiguousarray(raw), kind).astype(np.float16).reshape(shape)


def host_gpu():
    """The loader's GPU paths over NumPy arrays: quantized weights kept in their blocks, or expanded to
    fp16 as --weights fp16 does (gguf's dequantization for the device's kernel)."""
    from types import SimpleNamespace

    from engine.ops.backend import Backend

    return Backend("gpu", np, np.float16, "numpy standing in for a gpu", SimpleNamespace(kernels=HostKernels))


def assert_equal_arrays(a: np.ndarray, b: np.ndarray, where: str) -> None:
    """np.testing.assert_array_equal's verdict, its slow element-wise report only when they differ."""
    if not np.array_equal(a, b, equal_nan=True):
        np.testing.assert_array_equal(a, b, err_msg=where)


def assert_same_weights(a, b, where: str) -> None:
    """Two Weights (or their parts) equal bit for bit: arrays, QuantMatrix parts (kind, rows, bytes)."""
    from dataclasses import fields, is_dataclass

    from engine.core.quantized import QuantMatrix

    if isinstance(a, QuantMatrix):
        assert isinstance(b, QuantMatrix) and a.cols == b.cols, where
        assert [(p.kind, p.rows) for p in a.parts] == [(p.kind, p.rows) for p in b.parts], where
        for pa, pb in zip(a.parts, b.parts):
            assert_equal_arrays(pa.data, pb.data, where)
    elif isinstance(a, list):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same_weights(x, y, f"{where}[{i}]")
    elif is_dataclass(a) and not isinstance(a, type):
        for f in fields(a):
            assert_same_weights(getattr(a, f.name), getattr(b, f.name), f"{where}.{f.name}")
    elif a is None or isinstance(a, (int, float, str, bool)):
        assert a == b, where
    else:
        assert_equal_arrays(np.asarray(a), np.asarray(b), where)


@pytest.mark.parametrize("which, world, backend", [("q4_1", 3, "cpu"), ("default", 3, "blocks"),
                                                   ("qwen2", 2, "cpu"), ("qwen3", 2, "cpu"), ("q4_k_m", 2, "blocks"),
                                                   ("q4_k_m", 2, "fp16")])
def test_a_shard_loaded_alone_is_the_split_of_the_whole(which, world, backend, model_path, small_q4_1, families,
                                                        tmp_path):
    """load_model(shard=(rank, world)) reads only a rank's rows and columns from the file (a model
    larger than one GPU never lands whole on any of them), and gets exactly what splitting the whole
    model gives: dense float32 as the CPU loads it, and GGUF blocks as the GPU keeps them."""
    from engine.parallel.tensor_parallel import shard_weights

    # q4_1: the default model's block type split over three at a size the CPU expands at once (the default model
    # itself expanded four times took a twentieth of the suite)
    named = {"default": str(model_path), "q4_1": small_q4_1}
    path = named.get(which) or str(families.get(which, tmp_path / "q4_k_m.gguf"))
    if which == "q4_k_m":
        make_synthetic([path, "--layers", "2", "--dim", "512", "--ffn", "1024", "--heads", "4", "--kv-heads", "2",
                        "--ctx", "256", "--type", "Q4_K_M"])
    device, blocks = (cpu_backend(), True) if backend == "cpu" else (host_gpu(), backend == "blocks")
    cfg, whole, _ = load_model(path, device, keep_blocks=blocks)
    for rank in range(world):
        part_cfg, part, _ = load_model(path, device, keep_blocks=blocks, shard=(rank, world))
        assert part_cfg == shard_config(cfg, world)
        assert_same_weights(part, shard_weights(cfg, whole, rank, world), f"{which} rank {rank}")
    assert (backend == "blocks") == any(type(w).__name__ == "QuantMatrix" for w in vars(whole.layers[0]).values())
