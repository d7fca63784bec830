"""The CPU's expanded weights kept on disk (engine/model/expanded_cache.py): a later load reads the files the
first wrote, its values bit for bit the expansion's; a shard is its own file; a folder that cannot be written
is said once and the load goes on without it. On a small synthetic model (tests/engine/conftest.py small_q4_1):
the cache's logic is the same at any size, and the default model's five loads took a fifth of a minute."""
from __future__ import annotations

import numpy as np
import pytest

from engine.model.expanded_cache import ENV
from engine.model.weights import load_model
from engine.ops.backend import select_backend


@pytest.fixture
def model_path(small_q4_1):
    return small_q4_1


def matrices(weights) -> list[np.ndarray]:
    layer = weights.layers[0]
    return [weights.tok_embd, weights.head, layer.wqkv, layer.wo, layer.w_gate_up, layer.w_down]


def test_a_later_load_reads_what_the_first_wrote_bit_for_bit(model_path, tmp_path, monkeypatch):
    backend = select_backend("cpu")
    monkeypatch.delenv(ENV, raising=False)
    _, expanded, _ = load_model(model_path, backend)
    monkeypatch.setenv(ENV, str(tmp_path))
    load_model(model_path, backend)
    written = sorted(tmp_path.rglob("*.npy"))
    head = 0 if expanded.head is expanded.tok_embd else 1  # (this file's head is its own; the default model's is tied)
    assert len(written) == 1 + head + 4 * len(expanded.layers)  # the embedding, the head, 4 stacked matrices a layer
    for path in written:  # what a later load reads is the files' (a changed file would show)
        values = np.load(path)
        values[0, 0] = np.float32(7.0)
        np.save(path, values)
    _, later, _ = load_model(model_path, backend)
    for want, read in zip(matrices(expanded), matrices(later)):
        assert read.flags.f_contiguous == want.flags.f_contiguous and read.dtype == want.dtype
        assert read[0, 0] == 7.0 and np.array_equal(read[1:], want[1:]) and np.array_equal(read[0, 1:], want[0, 1:])
    for path in written:
        path.unlink()
    _, again, _ = load_model(model_path, backend)  # the files gone: expanded again, bit for bit
    assert all(np.array_equal(a, b) for a, b in zip(matrices(again), matrices(expanded)))
    _, shard, _ = load_model(model_path, backend, shard=(1, 3))
    assert len(list(tmp_path.rglob("*.npy"))) > len(written)  # a shard's matrices are files of their own
    assert shard.layers[0].w_down.shape[1] == expanded.layers[0].w_down.shape[1] // 3


def test_a_folder_that_cannot_be_written_is_said_and_the_load_goes_on(model_path, tmp_path, monkeypatch, capsys):
    blocked = tmp_path / "file"
    blocked.write_text("not a folder")
    monkeypatch.setenv(ENV, str(blocked))
    _, weights, _ = load_model(model_path, select_backend("cpu"))
    said = [line for line in capsys.readouterr().err.splitlines() if "expanded weights are not kept" in line]
    assert len(said) == 1 and weights.layers[-1].w_down.shape[0] > 0
