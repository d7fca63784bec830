"""Rows that do not depend on the step (engine/ops/blas_order.py, ArrayOps): on the real default
model, a prompt's logits and K/V rows are the same bits however its read is cut, whatever other
reads share its steps, and a decode row is the same alone and in a batch."""
import numpy as np
import pytest

from engine.kvcache.kv import KVCache
from engine.model.forward import LlamaModel
from engine.ops.backend import KEY_TILE
from engine.ops.blas_order import rows_invariant

BLOCK = 16


@pytest.fixture(scope="module")
def model(loaded):
    return LlamaModel(loaded.cfg, loaded.weights, loaded.backend)


@pytest.fixture
def kv(loaded):
    return KVCache(loaded.cfg, 1024, loaded.backend, BLOCK, 192)


def tables(*lengths):
    """Disjoint block tables for sequences of these lengths."""
    out, at = [], 0
    for n in lengths:
        count = -(-n // BLOCK)
        out.append(list(range(at, at + count)))
        at += count
    return out


def prompt(seed: int, n: int, vocab: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, vocab, n)


def read(model, kv, ids, table, cuts):
    """ids read in pieces ending at `cuts` (then at its end), alone; its last logits on the host."""
    start, logits = 0, None
    for end in [*cuts, len(ids)]:
        logits = model.forward_reads([(ids[start:end], start, table, end == len(ids))], kv)
        start = end
    return np.asarray(logits[0])


def test_the_engine_processes_blas_gives_rows_that_do_not_depend_on_the_shape(loaded):
    """The check the runner makes at start passes with the kernels the engine asks for (tests/conftest.py
    asks for them as the engine does); its k values include 576 and 1536, the default model's."""
    layer = loaded.weights.layers[0]
    assert rows_invariant([layer.wqkv, layer.w_down], loaded.cfg.head_dim, KEY_TILE)


@pytest.mark.parametrize("cuts", [[1, 255], [64, 128, 192, 256], [5, 6, 200, 299]])  # (edges merged: a whole read each)
def test_a_read_cut_anywhere_gives_the_same_bits(model, kv, loaded, cuts):
    ids = prompt(1, 300, loaded.cfg.vocab_size)  # over KEY_TILE keys: the tile past the diagonal, padded
    (table,) = tables(300)
    whole = read(model, kv, ids, table, [])
    rows = np.asarray(kv.keys[:, table]).copy()
    assert np.array_equal(read(model, kv, ids, table, cuts), whole)
    assert np.array_equal(np.asarray(kv.keys[:, table]), rows)  # the K rows too (a cached prefix is reused)


def test_reads_sharing_steps_give_each_its_bits_alone(model, kv, loaded):
    a, b, c = (prompt(seed, n, loaded.cfg.vocab_size) for seed, n in ((2, 300), (3, 77), (4, 9)))
    ta, tb, tc = tables(300, 77, 9)
    alone = [read(model, kv, ids, t, []) for ids, t in ((a, ta), (b, tb), (c, tc))]
    model.forward_reads([(a[:200], 0, ta, False), (b[:5], 0, tb, False)], kv)
    first = model.forward_reads([(c, 0, tc, True), (b[5:60], 5, tb, False), (a[200:201], 200, ta, False)], kv)
    last = model.forward_reads([(b[60:], 60, tb, True), (a[201:], 201, ta, True)], kv)
    assert np.array_equal(np.asarray(first[0]), alone[2])
    assert np.array_equal(np.asarray(last[0]), alone[1])
    assert np.array_equal(np.asarray(last[1]), alone[0])


def test_a_decode_row_is_the_same_alone_and_in_a_batch(model, kv, loaded):
    a, b = prompt(5, 70, loaded.cfg.vocab_size), prompt(6, 130, loaded.cfg.vocab_size)
    ta, tb = tables(71, 131)
    model.forward_reads([(a, 0, ta, False), (b, 0, tb, False)], kv)
    alone = np.asarray(model.forward_batch(np.array([7]), [ta], [70], kv))[0].copy()
    batch = np.asarray(model.forward_batch(np.array([11, 7]), [tb, ta], [130, 70], kv))
    assert np.array_equal(batch[1], alone)
