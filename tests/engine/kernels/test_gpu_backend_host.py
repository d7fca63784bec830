"""The GPU backend end to end on the CPU (host_gpu.py: HalfCupyOps and GpuKernels over NumPy, every kernel the
model launches run on the host): the hybrid fixtures through the runner as a GPU engine runs them but for CUDA
graphs: the start's warm-up (a decode step, the rows' check), each prompt read in chunks and every position
decoded (to 80) near transformers' logits (fp16 activations: ~0.1% of their spread, a few percent where fp16 flips a
near-tied expert), the first greedy token the same, a read cut short and read again the same bits, and a
request's recurrent state through a spill to host memory and back unchanged."""
import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from engine.kernels.model_parts import ModelKernels
from engine.kvcache.recurrent import SequenceState
from engine.model.weights import load_model
from engine.modelfile.gguf_file import GGUFFile
from engine.modelfile.model_config import read_config
from engine.runner.runner import ModelRunner
from tests.engine.kernels.host_cuda import compiler
from tests.engine.kernels.host_gpu import host_gpu_backend

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures/hybrid"
GOLDEN = json.loads((FIXTURES / "hybrid_golden.json").read_text())
DECODED = 80  # positions of the longest prompt decoded a row at a time (past the delta rule's first chunk)


@pytest.fixture(scope="module", params=sorted(GOLDEN["models"]))
def family(request, tmp_path_factory):
    assert compiler() is not None, "a C++ compiler (g++) is needed to run the kernels on the CPU"
    spec = GOLDEN["models"][request.param]
    path = FIXTURES / spec["file"]
    assert hashlib.sha256(path.read_bytes()).hexdigest() == spec["sha256"], "the fixture's file changed"
    reader = GGUFFile(str(path), "r")
    backend = host_gpu_backend(ModelKernels.of(read_config(reader), reader), tmp_path_factory.mktemp("gpu"))
    cfg, weights, _ = load_model(str(path), backend, reader=reader)
    runner = ModelRunner(cfg, weights, backend, ctx=512, chunk=64, eos_ids=frozenset(), max_running=2,
                         cuda_graphs=False)
    runner.warm_up()
    return spec, runner


def read(runner, ids, table, cuts=()) -> tuple[np.ndarray, SequenceState]:
    state = SequenceState.fresh(runner.recurrent)
    logits = None
    for end in [*cuts, len(ids)]:
        pos = state.rewind()
        logits = runner.forward(np.asarray(ids[pos:end]), pos, table, end == len(ids), state=state)
        state.read(pos, end - pos)
    return runner.backend.to_host(logits), state


def error(got, want) -> float:
    want = np.asarray(want)
    return float(np.abs(np.asarray(got) - want).max() / (want.max() - want.min()))


def test_prompts_read_and_decoded_match_transformers(family):
    spec, runner = family
    for case in spec["cases"]:
        logits, _ = read(runner, case["ids"], list(range(runner.pool.blocks_for(len(case["ids"]) + 1))))
        assert error(logits[case["probes"]], case["probe_logits"]) < 0.01
        assert int(np.argmax(logits)) == case["greedy"][0]
    case = next(c for c in spec["cases"] if "probe_logits_every_position" in c)
    ids, table = case["ids"], list(range(runner.pool.blocks_for(len(case["ids"]) + 1)))
    _, state = read(runner, ids[:1], table)
    errors = []
    for pos in range(1, DECODED):
        row = runner.backend.to_host(runner.decode_logits([ids[pos]], [table], [pos], [state])[0])
        state.decoded()
        errors.append(error(row[case["probes"]], case["probe_logits_every_position"][pos]))
    assert np.median(errors) < 0.005 and np.mean(np.asarray(errors) > 0.01) < 0.03 and max(errors) < 0.25


def test_a_cut_read_and_a_spilled_state_keep_their_bits(family):
    _, runner = family
    ids = np.random.default_rng(4).integers(0, runner.vocab_size, 150)
    table = list(range(runner.pool.blocks_for(160)))
    whole, whole_state = read(runner, ids, table)
    cut, cut_state = read(runner, ids, table, cuts=(100,))  # read again from 64, its mark
    assert np.array_equal(cut, whole) and cut_state.now.digest() == whole_state.now.digest()
    there = cut_state.on(np)  # a spill's move to host memory, and back
    assert isinstance(there.now.ssm, np.ndarray) and there.now.digest() == whole_state.now.digest()
    back = there.on(runner.backend.xp)
    assert back.now.digest() == whole_state.now.digest() and back.mark.digest() == whole_state.mark.digest()
