"""Routed experts in host memory behind a few device slots (engine/ops/expert_cache.py, issue 46), on the GPU
backend run on the CPU (host_gpu.py): a MoE model's logits the same bits with three slots of eight experts as
with every expert resident, a prompt chunk's rows in groups whose experts fit (copied in), every decode step
reading its experts where the tables say (a slot, or host memory) and the refills after it keeping the tables
where the experts are."""
import numpy as np

from engine.kernels.args import address
from engine.model.weights import load_model
from engine.ops.expert_cache import caches as caches_of
from engine.runner.runner import ModelRunner
from tests.engine.kernels.host_cuda import compiler
from tests.engine.kernels.host_gpu import host_gpu_model
from tests.engine.kernels.hybrid_reference import FIXTURES, read

SLOTS = 3  # of the fixture's 8 experts (2 a token)


def run(runner, ids, steps: int) -> list[np.ndarray]:
    """ids read, then `steps` greedy decode steps: every step's logits on the host."""
    table = list(range(runner.pool.blocks_for(len(ids) + steps + 1)))
    logits, state = read(runner, ids, table)
    out = [logits]
    for _ in range(steps):
        row = runner.decode_logits([int(np.argmax(out[-1]))], [table], [state.now_at], [state])[0]
        state.decoded()
        out.append(runner.backend.to_host(row))
    return out


def test_three_slots_of_eight_experts_give_the_resident_experts_bits(tmp_path):
    assert compiler() is not None, "a C++ compiler (g++) is needed to run the kernels on the CPU"
    path = FIXTURES / "qwen3next.gguf"
    backend, cfg, weights = host_gpu_model(path, tmp_path)
    runner = ModelRunner(cfg, weights, backend, ctx=512, chunk=64, eos_ids=frozenset(), max_running=2,
                         cuda_graphs=False)
    ids = np.random.default_rng(6).integers(0, cfg.vocab_size, 72)  # (a chunk of 64 and a part one)
    resident = run(runner, ids, 4)
    cfg, weights, _ = load_model(str(path), backend, expert_slots=SLOTS)  # (the host's in pinned memory)
    caches = caches_of(weights.layers)
    assert len(caches) == cfg.n_layers
    cached = run(ModelRunner(cfg, weights, backend, ctx=512, chunk=64, eos_ids=frozenset(), max_running=2,
                             cuda_graphs=False), ids, 4)
    assert all(np.array_equal(a, b) for a, b in zip(resident, cached))
    expert = sum(s.expert_bytes for s in (caches[0].host.gate, caches[0].host.up, caches[0].host.down))
    for cache in caches:
        assert cache.counts.misses > SLOTS and cache.counts.hits > 0  # experts read from host memory, and from slots
        assert cache.counts.bytes_copied % expert == 0 and cache.counts.bytes_copied >= SLOTS * expert
        for mapped, host, slots in ((cache.mapped.gate, cache.host.gate, cache.device.gate),
                                    (cache.mapped.down, cache.host.down, cache.device.down)):  # where each expert is
            where = [address(slots.data) + cache.slot_of[e] * host.expert_bytes if cache.slot_of[e] >= 0 else
                     address(host.data) + e * host.expert_bytes for e in range(host.experts)]
            assert mapped.table.tolist() == where
