"""Weights kept in their GGUF blocks (the GPU's default): the rows the loader stacks and reorders as
raw blocks must be, once dequantized, exactly the matrices the dense (CPU) path builds. The kernels
that read the blocks are checked against gguf's NumPy dequantization on the GPU machine
(tools/device/gpu_kernels_check.py)."""
from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf.quants import dequantize

from engine.ops.backend import cpu_backend
from engine.model.weights import TensorRows, WeightLoader
from engine.modelfile.gguf_file import GGUFFile  # the engine's reader (gguf.GGUFReader's values, ~10x faster)
from engine.modelfile.model_config import read_config
from engine.kernels import Q8_BYTES
from engine.core.quantized import QuantMatrix, Row8, row_bytes, stack_rows
from tools.fixtures.make_synthetic_gguf import main as make_synthetic


def expand(m: QuantMatrix) -> np.ndarray:
    """The NumPy reference of the kernels' expand: each part dequantized, stacked by rows."""
    out = []
    for part in m.parts:
        assert part.data.shape == (part.rows, row_bytes(part.kind, m.cols) // (2 if part.kind == "F16" else 1))
        if part.kind == "F16":
            out.append(part.data.astype(np.float32))
        else:
            out.append(dequantize(part.data, GGMLQuantizationType[part.kind]).astype(np.float32))
    return np.concatenate(out)


@pytest.fixture(scope="module")
def q4_k_m(tmp_path_factory) -> str:
    """A one-layer Q4_K_M-like file: Q4_K beside Q6_K (attn_v, ffn_down, head) in the same stacks."""
    path = str(tmp_path_factory.mktemp("synth") / "q4_k_m.gguf")
    make_synthetic([path, "--layers", "1", "--dim", "256", "--ffn", "512", "--heads", "4", "--kv-heads", "2",
                    "--ctx", "256", "--type", "Q4_K_M"])
    return path


@pytest.mark.parametrize("which", ["default", "q4_k_m"])
def test_stacked_blocks_equal_the_dense_matrices(which, q4_k_m, model_path):
    reader = GGUFFile(q4_k_m if which == "q4_k_m" else str(model_path))
    cfg = read_config(reader)
    loader = WeightLoader(reader, cfg, cpu_backend())
    p = "blk.0."
    stacks = {"wqkv": ([p + "attn_q.weight", p + "attn_k.weight", p + "attn_v.weight"],
                       [cfg.n_heads, cfg.n_kv_heads, None]),
              "gate_up": ([p + "ffn_gate.weight", p + "ffn_up.weight"], [None, None]),
              "down": ([p + "ffn_down.weight"], [None]), "embd": (["token_embd.weight"], [None])}
    kinds = set()
    for names, heads in stacks.values():
        ts = [loader.tensor(n) for n in names]
        blocks = stack_rows([TensorRows(t, heads=h).host_rows() for t, h in zip(ts, heads)], np.concatenate)
        dense = np.concatenate([TensorRows(t, heads=h).dense(loader) for t, h in zip(ts, heads)])
        assert blocks.shape == dense.shape
        np.testing.assert_array_equal(expand(blocks), dense)
        kinds |= {part.kind for part in blocks.parts}
        if which == "q4_k_m" and names[0].endswith("attn_q.weight"):
            assert [part.kind for part in blocks.parts] == ["Q4_K", "Q6_K"]  # q and k joined, v its own part
    assert kinds == ({"Q4_1", "Q8_0"} if which == "default" else {"Q4_K", "Q6_K"})


def test_quantized_matrix_bytes_are_the_files(q4_k_m):
    """Kept blocks take the file's bytes: no expansion hides in the loader."""
    reader = GGUFFile(q4_k_m)
    loader = WeightLoader(reader, read_config(reader), cpu_backend())
    t = loader.tensor("blk.0.ffn_gate.weight")
    m = stack_rows([TensorRows(t).host_rows()], np.concatenate)
    assert m.nbytes == int(t.n_bytes) and m.parts[0].kind == "Q4_K"


def test_activations_in_8_bits_round_to_the_nearest_step_of_each_unit():
    """engine.core.quantized.quantize_q8 is the reference of the kernels' 8-bit activation rows: per 32
    values a step d = max |x| / 127, every value within half a step, the largest exactly kept, and a
    unit of zeros stays zeros (no division by its zero scale)."""
    from engine.core.quantized import quantize_q8

    rng = np.random.default_rng(4)
    x = (rng.standard_normal(4096) * rng.choice([0.01, 1.0, 30.0], 4096)).astype(np.float16)
    x[:32] = 0
    q = quantize_q8(x).reshape(-1, 32)
    units = x.astype(np.float32).reshape(-1, 32)
    step = np.abs(units).max(axis=1, keepdims=True) / 127
    assert np.all(q[0] == 0)
    assert np.all(np.abs(q - units) <= step / 2 * (1 + 1e-6))
    np.testing.assert_allclose(np.abs(q).max(axis=1), np.abs(units).max(axis=1), rtol=1e-6)
    assert np.allclose(np.round(q[1:] / step[1:]), q[1:] / step[1:], atol=1e-3)  # whole steps


def test_decode_attention_splits_by_the_sequence_alone():
    """A sequence's flash-decoding split (keys per block) depends on its own length only, so that a
    captured step, an eager one and a batch beside longer sequences round alike; and every grid
    (sized for a graph's bucket or the longest sequence in a batch) holds all of any shorter
    sequence's splits, never more than the merge reads."""
    from hypothesis import given, strategies as st

    from engine.runner.decode_graph import bucket
    from engine.kernels import DECODE_MAX_SPLITS, decode_keys_per_block, decode_splits

    @given(st.integers(0, 200_000), st.integers(0, 200_000), st.integers(1, 262_144))
    def check(pos, other, ctx):
        if max(pos, other) >= ctx:
            return
        per_block = decode_keys_per_block(pos + 1)
        assert per_block % 64 == 0
        used = -(-(pos + 1) // per_block)
        for keys in (bucket(max(pos, other), ctx), max(pos, other) + 1):
            assert used <= decode_splits(keys) <= DECODE_MAX_SPLITS

    check()


def test_flash_decoding_blocks_take_every_split_once():
    """A flash-decoding grid of x blocks a (sequence, K/V head group): block b takes splits b, b + x,
    ... (attention.cu), so every split of the sequence is some block's, none is two blocks', and x
    shrinks only once the grid would exceed DECODE_BLOCKS_PER_SM blocks a multiprocessor."""
    from hypothesis import given, strategies as st

    from engine.kernels import DECODE_BLOCKS_PER_SM, DECODE_MAX_SPLITS, decode_blocks_x

    @given(st.integers(1, DECODE_MAX_SPLITS), st.integers(1, 256), st.integers(1, 16), st.integers(1, 160))
    def check(splits, seqs, blocks_y, sms):
        x = decode_blocks_x(splits, seqs, blocks_y, sms)
        assert 1 <= x <= splits
        taken = sorted(split for b in range(x) for split in range(b, splits, x))
        assert taken == list(range(splits))
        if seqs * blocks_y * splits <= DECODE_BLOCKS_PER_SM * sms:
            assert x == splits  # a small grid: one split a block, as before
        else:
            assert seqs * blocks_y * x <= 2 * DECODE_BLOCKS_PER_SM * sms or x == 1

    check()


def test_kernel_sources_carry_their_headers():
    """CuPy caches compiled modules by their source text: a header must be pasted in, not included,
    so that changing it recompiles every kernel file that uses it; each header once, however many
    of the file's headers include it (moe.cu reaches q8.cuh through quant_blocks.cuh and matvec.cuh)."""
    from engine.kernels import KERNEL_DIR, kernel_source

    for name in ("quant.cu", "norm_rope.cu", "attention.cu", "moe.cu"):
        source = kernel_source(name)
        assert '#include "' not in source and "#pragma once" not in source
        assert source.count("struct Q8 {") == 1
    assert source.count("struct Raw {") == 1 and source.count("void mma_16x8x16(") == 1
    body = (KERNEL_DIR / "matvec.cuh").read_text().rsplit('#include "', 1)[1].split("\n", 1)[1].strip()  # after its includes
    assert body in kernel_source("quant.cu") and body in source


def test_a_row_of_a_decode_steps_rows_is_that_row_and_its_units():
    values = np.random.default_rng(3).standard_normal((3, 64)).astype(np.float16)
    units = np.arange(3 * 2 * Q8_BYTES, dtype=np.uint32).reshape(6, Q8_BYTES)  # two 48-byte units a row, row by row
    row = Row8(values, units).row(1)
    np.testing.assert_array_equal(row.values, values[1:2])
    np.testing.assert_array_equal(row.q8, units[2:4])
