"""Prompt weights kept expanded (engine/kvcache/prompt_weights.py) on the host-run GPU backend: a prompt read through
the kept expansions gives the logits, bit for bit, of the same read whose every quantized matrix was expanded into
the scratch at its step (the device's check: tools/device/prompt_weights_check.py)."""
import numpy as np

from engine.model.weights import keep_expansions
from engine.runner.runner import ModelRunner
from tests.engine.kernels.host_gpu import host_gpu_model
from tests.engine.kernels.test_fused_host import small_llama


def test_a_read_through_kept_expansions_has_the_bits_of_one_expanded_at_each_step(tmp_path):
    backend, cfg, weights = host_gpu_model(small_llama(tmp_path), tmp_path)
    runner = ModelRunner(cfg, weights, backend, ctx=512, chunk=64, eos_ids=frozenset(), max_running=2,
                         cuda_graphs=False)
    kernels, prompt = backend.ops.kernels, np.arange(40, dtype=np.int64) * 7 + 3

    def read() -> np.ndarray:
        table = runner.pool.allocate(runner.pool.blocks_for(len(prompt) + 1))
        return np.array(runner.forward(prompt, 0, table, want_logits=True))

    per_step = read()
    assert not kernels.kept
    matrices = keep_expansions(backend, weights.layers)
    assert matrices and all(kernels.expand(w) is kernels.kept[id(w)][1] for w in matrices)  # not the scratch
    kept = read()
    assert np.isfinite(per_step).all() and per_step.std() > 0
    assert np.array_equal(kept, per_step)
