"""The hybrid families' GPU mixer inside the real model and runner: a backend whose hybrid operations (the Gated
DeltaNet mixer, the sigmoid gate, the shared expert's gated sum: engine/ops/hybrid_ops.py's HybridHalfOps) are
linear_attention.cu's kernels run on the host (host_cuda.py) with fp16 between them as on the GPU, the rest of
the forward NumPy's. On the three fixtures (tests/fixtures/hybrid): each prompt's logits near transformers'
and its first greedy token the same, read in chunks, and every position's decoded through the runner (the states'
addresses, a read's marks, decode rows); and a read cut short of a boundary, read again from its mark, gives the
same bits."""
import hashlib

import numpy as np
import pytest

from engine.kernels.linear_attention_launch import LinearAttentionLaunchers
from engine.kernels.loader import built_kernels
from engine.model.weights import load_model
from engine.ops.backend import ArrayOps, Backend
from engine.ops.hybrid_ops import HybridHalfOps
from engine.runner.runner import ModelRunner
from tests.engine.kernels.host_cuda import HostKernels, compiler
from tests.engine.kernels.hybrid_reference import FIXTURES, GOLDEN, check_a_cut_read, check_against_transformers

F16 = np.float16


class HostHybridOps(HybridHalfOps, ArrayOps):
    """ArrayOps with the hybrid operations on linear_attention.cu's kernels (fp16 in and out, as on the GPU)."""

    def __init__(self, kernels: LinearAttentionLaunchers):
        ArrayOps.__init__(self, np)
        self.kernels = kernels

    def delta_net(self, proj, lw, hy, j, rows, eps):
        return self.kernels.delta_net(proj.astype(F16), lw, hy, j, rows, eps).astype(np.float32)

    def sigmoid_mul(self, x, gate):
        return self.kernels.sigmoid_mul(x.astype(F16), gate.astype(F16)).astype(np.float32)

    def add_gated(self, delta, shared, h, gate_w):  # (NumPy's, on fp16 rows as the GPU's are: its kernel is the
        # norm's, norm_rope.cu's add_gated_rms_norm, checked in test_norm_rope_host.py)
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


def test_prompts_read_and_decoded_match_transformers(family):
    """Near transformers' float32 logits: fp16 between the kernels, as on the GPU, moves them by ~0.1% of their
    spread, and where two experts' router scores are that close it flips the choice (qwen3next: layer 2's second
    expert at positions 73 and 128; greedy continuations part at such ties too, as llama.cpp's do)."""
    spec, runner = family
    check_against_transformers(runner, spec)


def test_a_read_cut_short_of_a_boundary_and_read_again_gives_the_same_bits(family):
    check_a_cut_read(family[1])
