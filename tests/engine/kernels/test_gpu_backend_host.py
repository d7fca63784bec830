"""The GPU backend end to end on the CPU (host_gpu.py: HalfCupyOps and GpuKernels over NumPy, every kernel the
model launches run on the host): the qwen3next fixture through the runner as a GPU engine runs them but for CUDA
graphs: the start's warm-up (a decode step, the rows' check), each prompt read in chunks and every position
decoded (to 80) near transformers' logits (fp16 activations: ~0.1% of their spread, a few percent where fp16 flips a
near-tied expert), the first greedy token the same, a read cut short and read again the same bits, a
request's recurrent state through a spill to host memory and back unchanged, and prompt log-probabilities those of
each prefix's own logits."""
import hashlib

import numpy as np
import pytest

from engine.runner.runner import ModelRunner
from tests.engine.kernels.host_cuda import compiler
from tests.engine.kernels.host_gpu import host_gpu_model
from tests.engine.kernels.hybrid_reference import FIXTURES, GOLDEN, check_a_cut_read, check_against_transformers
DECODED = 80  # positions of the longest prompt decoded a row at a time (past the delta rule's first chunk)


@pytest.fixture(scope="module", params=["qwen3next"])  # (the mixture of experts, grouped heads: the most kernels;
# the other two families' GPU kernels run in test_hybrid_model_host.py, and on a GPU in tools/device/hybrid_check.py)
def family(request, tmp_path_factory):
    assert compiler() is not None, "a C++ compiler (g++) is needed to run the kernels on the CPU"
    spec = GOLDEN["models"][request.param]
    path = FIXTURES / spec["file"]
    assert hashlib.sha256(path.read_bytes()).hexdigest() == spec["sha256"], "the fixture's file changed"
    backend, cfg, weights = host_gpu_model(path, tmp_path_factory.mktemp("gpu"))
    runner = ModelRunner(cfg, weights, backend, ctx=512, chunk=64, eos_ids=frozenset(), max_running=2,
                         cuda_graphs=False)
    runner.warm_up()
    return spec, runner


def test_prompts_read_and_decoded_match_transformers(family):
    spec, runner = family
    check_against_transformers(runner, spec, DECODED)


def test_a_cut_read_and_a_spilled_state_keep_their_bits(family):
    state = check_a_cut_read(family[1])
    there = state.on(np)  # a spill's move to host memory, and back
    assert isinstance(there.now.ssm, np.ndarray) and there.now.digest() == state.now.digest()
    back = there.on(family[1].backend.xp)
    assert back.now.digest() == state.now.digest() and back.mark.digest() == state.mark.digest()


def test_prompt_log_probabilities_are_the_ones_each_prefix_s_logits_give(family):
    """The scored rows (the final norm's output, float32 as embeddings take it) go through the GPU's head kernel in
    its fp16: each prompt token's log-probability is the one its prefix's own last logits give (through the head
    as float32 bytes the kernel read halves, and every value was hundreds of nats off on a GPU)."""
    from engine.runner.prompt_scores import PromptScorer
    from tests.engine.model.test_hybrid import fresh
    _, runner = family
    prompt = [int(t) for t in np.random.default_rng(5).integers(1, runner.vocab_size, 12)]
    table = runner.pool.allocate(runner.pool.blocks_for(len(prompt)))
    try:
        scorer = PromptScorer(tuple(prompt), 2, runner.model)
        rows = scorer.wanted(0, len(prompt))
        _, hidden = runner.forward(np.asarray(prompt), 0, table, want_logits=True, state=fresh(runner),
                                   hidden_rows=rows)
        scorer.add(hidden, 0, len(prompt))
        got = [v for line in scorer.take(1) for v in line.logprobs]
        want = []
        for i in range(len(prompt) - 1):  # prefix i's last logits, read alone from a fresh state
            logits = np.asarray(runner.backend.to_host(runner.forward(np.asarray(prompt[: i + 1]), 0, table, True,
                                                                      state=fresh(runner))), dtype=np.float64)
            want.append(logits[prompt[i + 1]] - logits.max() - np.log(np.exp(logits - logits.max()).sum()))
        assert got == pytest.approx(want, abs=2e-3)
    finally:
        runner.pool.release(table)
