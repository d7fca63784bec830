"""The hybrid families' GPU mixer inside the real model and runner: a backend whose hybrid operations (the Gated
DeltaNet mixer, the sigmoid gate, the shared expert's gated sum: engine/ops/hybrid_ops.py's HybridHalfOps) are
linear_attention.cu's kernels run on the host (host_cuda.py) with fp16 between them as on the GPU, the rest of
the forward NumPy's. On the three fixtures (tests/fixtures/hybrid): each prompt's logits near transformers'
and its first greedy token the same, read in chunks, and every position's decoded through the runner (the states'
addresses, a read's marks, decode rows); and a read cut short of a boundary, read again from its mark, gives the
same bits."""
import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from engine.kernels.linear_attention_launch import LinearAttentionLaunchers
from engine.kernels.loader import built_kernels
from engine.kvcache.recurrent import SequenceState
from engine.model.weights import load_model
from engine.ops.backend import ArrayOps, Backend
from engine.ops.hybrid_ops import HybridHalfOps
from engine.runner.runner import ModelRunner
from tests.engine.kernels.host_cuda import HostKernels, compiler

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures/hybrid"
GOLDEN = json.loads((FIXTURES / "hybrid_golden.json").read_text())
F16 = np.float16


class HostHybridOps(HybridHalfOps, ArrayOps):
    """ArrayOps with the hybrid operations on linear_attention.cu's kernels (fp16 in and out, as on the GPU)."""

    def __init__(self, kernels: LinearAttentionLaunchers):
        ArrayOps.__init__(self, np)
        self.kernels = kernels

    def delta_net(self, proj, lw, hy, j, rows, eps):
        return super().delta_net(proj.astype(F16), lw, hy, j, rows, eps).astype(np.float32)

    def sigmoid_mul(self, x, gate):
        return super().sigmoid_mul(x.astype(F16), gate.astype(F16)).astype(np.float32)

    def add_gated(self, delta, shared, h, gate_w):
        return super().add_gated(delta.astype(F16), shared.astype(F16), h.astype(F16), gate_w).astype(np.float32)


@pytest.fixture(scope="module")
def backend(tmp_path_factory) -> Backend:
    assert compiler() is not None, "a C++ compiler (g++) is needed to run the kernels on the CPU"
    kernels = LinearAttentionLaunchers()
    kernels.cp = np
    kernels.fn = HostKernels("linear_attention.cu", tmp_path_factory.mktemp("hybrid_host"),
                             built_kernels()["linear_attention.cu"])
    return Backend("cpu", np, np.float32, "cpu, linear_attention.cu on the host", HostHybridOps(kernels))


@pytest.fixture(scope="module", params=sorted(GOLDEN["models"]))
def family(request, backend):
    spec = GOLDEN["models"][request.param]
    path = FIXTURES / spec["file"]
    assert hashlib.sha256(path.read_bytes()).hexdigest() == spec["sha256"], "the fixture's file changed"
    cfg, weights, _ = load_model(str(path), backend)
    return spec, ModelRunner(cfg, weights, backend, ctx=512, chunk=64, eos_ids=frozenset(), max_running=2)


def read(runner, ids, table, cuts=()) -> tuple[np.ndarray, SequenceState]:
    state = SequenceState.fresh(runner.recurrent)
    logits = None
    for end in [*cuts, len(ids)]:
        pos = state.rewind()
        logits = runner.forward(np.asarray(ids[pos:end]), pos, table, end == len(ids), state=state)
        state.read(pos, end - pos)
    return np.array(logits), state


def test_prompts_read_and_decoded_match_transformers(family):
    """Each prompt's last logits read in chunks, and the longest prompt fed a token at a time as decode rows (each
    position's probes), near transformers' float32 ones. fp16 between the kernels, as on the GPU, moves them by
    ~0.1% of their spread, and where two experts' router scores are that close it flips the choice: a position's
    logits then move by a few percent (qwen3next: layer 2's second expert at positions 73 and 128; greedy
    continuations part at such ties too, as llama.cpp's do), so a few positions may be further off."""
    spec, runner = family
    for case in spec["cases"]:
        table = list(range(runner.pool.blocks_for(len(case["ids"]) + 1)))
        logits, _ = read(runner, case["ids"], table)
        assert error(logits[case["probes"]], case["probe_logits"]) < 0.01
        assert int(np.argmax(logits)) == case["greedy"][0]
    case = next(c for c in spec["cases"] if "probe_logits_every_position" in c)
    ids, table = case["ids"], list(range(runner.pool.blocks_for(len(case["ids"]) + 1)))
    _, state = read(runner, ids[:1], table)
    errors = []
    for pos in range(1, len(ids)):
        row = runner.decode_logits([ids[pos]], [table], [pos], [state])[0]
        state.decoded()
        errors.append(error(np.asarray(row)[case["probes"]], case["probe_logits_every_position"][pos]))
    assert np.median(errors) < 0.005 and np.mean(np.asarray(errors) > 0.01) < 0.03 and max(errors) < 0.1


def error(got, want) -> float:
    """The largest distance, in the reference logits' spread."""
    want = np.asarray(want)
    return float(np.abs(got - want).max() / (want.max() - want.min()))


def test_a_read_cut_short_of_a_boundary_and_read_again_gives_the_same_bits(family):
    _, runner = family
    ids = np.random.default_rng(4).integers(0, runner.vocab_size, 150)
    table = list(range(runner.pool.blocks_for(160)))
    whole, whole_state = read(runner, ids, table)
    cut, cut_state = read(runner, ids, table, cuts=(100,))  # read again from 64, its mark
    assert np.array_equal(cut, whole) and cut_state.now.equals(whole_state.now)
