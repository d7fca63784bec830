"""The CPU's dequantization (engine/model/dequant.py) gives the `gguf` package's values bit for bit, for
every block type it expands, into either memory order and any column range; and the weights a model
loads are the arrays the `gguf` path made (values, reordering, stacking, column-major order)."""
import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf.quants import dequantize as gguf_dequantize

from engine.ops.backend import cpu_backend
from engine.model.dequant import EXPAND, dequantize, dequantize_into
from engine.model.weights import TensorRows, WeightLoader, deinterleave_heads, host_matrix
from engine.modelfile.gguf_file import GGUFFile
from engine.modelfile.model_config import read_config

# fp16 scales at their edges: zeros of both signs, the smallest subnormal, the largest finite, infinities, NaN
EDGE_SCALES = np.array([0.0, -0.0, 2**-24, -(2**-24), 65504.0, -65504.0, np.inf, -np.inf, np.nan, 1.0], np.float16)
SCALE_AT = {"Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "Q8_0": [0],
            "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208]}  # where each type's fp16 scales sit in its block


def random_rows(kind: str, rows: int, blocks_a_row: int, seed: int) -> np.ndarray:
    """(rows, row bytes) of random blocks, a tenth of their scales set to an edge value."""
    _, nbytes, _ = EXPAND[kind]
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, (rows * blocks_a_row, nbytes), dtype=np.uint8)
    for at in SCALE_AT[kind]:
        edge = rng.random(len(raw)) < 0.1
        raw[edge, at:at + 2] = rng.choice(EDGE_SCALES, edge.sum()).view(np.uint8).reshape(-1, 2)
    return raw.reshape(rows, blocks_a_row * nbytes)


def reference(raw: np.ndarray, kind: str) -> np.ndarray:
    with np.errstate(all="ignore"):
        return gguf_dequantize(raw, GGMLQuantizationType[kind]).reshape(len(raw), -1)


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype == np.float32 and a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


@pytest.mark.parametrize("kind", sorted(EXPAND))
@pytest.mark.parametrize("order", ["C", "F"])
def test_every_block_type_gives_the_gguf_package_values_bit_for_bit(kind, order):
    size = EXPAND[kind][0]
    for seed, (rows, blocks) in enumerate([(1, 1), (7, 3), (300, 8), (1000, 256 // size * 2)]):
        raw = random_rows(kind, rows, blocks, seed)
        want = reference(raw, kind)
        out = np.empty(want.shape, np.float32, order=order)
        with np.errstate(all="ignore"):
            dequantize_into(raw, kind, out)
            assert same_bits(out, want), (kind, rows, blocks)
            assert same_bits(dequantize(raw, kind), want)
        lo, hi = size // 2, want.shape[1] - 3  # a column range cutting blocks
        part = np.empty((rows, hi - lo), np.float32, order=order)
        with np.errstate(all="ignore"):
            dequantize_into(raw, kind, part, (lo, hi))
        assert same_bits(part, np.ascontiguousarray(want[:, lo:hi]))


def test_rows_longer_than_a_chunk_are_expanded_whole(monkeypatch):
    import engine.model.dequant as dequant

    monkeypatch.setattr(dequant, "CHUNK_VALUES", 64)  # several rows a chunk, a row several chunks: both sides
    for cols in (32, 4096):
        raw = random_rows("Q8_0", 37, cols // 32, cols)
        out = np.empty((37, cols), np.float32, order="F")
        with np.errstate(all="ignore"):
            dequantize_into(raw, "Q8_0", out)
        assert same_bits(out, reference(raw, "Q8_0"))


def old_matrix(pieces: list[TensorRows]) -> np.ndarray:
    """The weights as the loader made them through the `gguf` package: each tensor's values, its
    Q/K rows reordered, the shard's rows and columns picked, stacked, then made column-major."""
    parts = []
    for p in pieces:
        t = p.tensor
        w = reference(p.raw(), t.tensor_type.name) if t.tensor_type.name in EXPAND else p.raw().astype(np.float32)
        w = deinterleave_heads(w, p.heads) if p.heads else w
        parts.append(p.selected(w))
    return np.asfortranarray(np.concatenate(parts))


def test_the_default_models_weights_are_the_gguf_paths_arrays(model_path):
    reader = GGUFFile(model_path, "r")
    cfg = read_config(reader)
    loader = WeightLoader(reader, cfg, cpu_backend())
    p = "blk.3."
    qkv = [TensorRows(loader.tensor(p + f"attn_{x}.weight"), heads=h) for x, h in
           (("q", cfg.n_heads), ("k", cfg.n_kv_heads), ("v", None))]
    shard = [TensorRows(loader.tensor(p + "ffn_gate.weight"), rows=(64, 448), cols=(32, 544)),
             TensorRows(loader.tensor(p + "ffn_up.weight"), rows=(0, 100), cols=(32, 544))]
    for pieces in (qkv, shard, [TensorRows(loader.tensor("token_embd.weight"))]):
        ours, want = host_matrix(pieces), old_matrix(pieces)
        assert ours.flags.f_contiguous and same_bits(ours, want)
