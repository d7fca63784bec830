"""The context plan: on a GPU the slots' KV rows take what the weights leave, park snapshots go to
host memory; a --ctx that does not fit is refused with the numbers. (A stand-in device reports its
memory.)"""
from types import SimpleNamespace

import numpy as np
import pytest

from engine.gguf_model import ModelConfig, ModelLoadError
from engine import memory
from engine.memory import DEFAULT_SNAPSHOT_BYTES, MIN_SLOT_CTX, plan_context

GiB = 2**30
LLAMA3_8B = ModelConfig(arch="llama", name="8b", n_layers=32, dim=4096, ffn_dim=14336, n_heads=32, n_kv_heads=8,
                        head_dim=128, vocab_size=128256, context_length=131072, rope_base=5e5, norm_eps=1e-5)


def device(free_gib: float, weights_gib: float = 15.0):
    pool = SimpleNamespace(used_bytes=lambda: int(weights_gib * GiB))
    return SimpleNamespace(weight_dtype=np.float16, free_bytes=lambda: int(free_gib * GiB),
                           xp=SimpleNamespace(get_default_memory_pool=lambda: pool))


@pytest.fixture(autouse=True)
def host_with_256_gib(monkeypatch):
    monkeypatch.setattr(memory, "host_memory_bytes", lambda: 256 * GiB)


def test_a_large_gpu_holds_the_full_trained_context_and_a_snapshot_of_all_of_it():
    plan = plan_context(LLAMA3_8B, device(120), None, 2048, None)
    assert plan.ctx == 131072 and plan.kv_bytes == 131072 * 128 * 1024  # 128 KiB a position, fp16
    assert plan.snapshot_bytes == plan.kv_bytes  # in host memory: any read can park
    assert plan.info() == {"kv_cache_mib": "16384", "snapshot_budget_mib": "16384", "weights_mib": "15360"}


def test_slots_each_get_the_full_context_when_it_fits():
    plan = plan_context(LLAMA3_8B, device(120), None, 2048, None, slots=4)
    assert (plan.slots, plan.ctx) == (4, 131072) and plan.kv_bytes == 4 * 16 * GiB


def test_a_smaller_gpu_gets_the_largest_context_that_fits_each_slot():
    plan = plan_context(LLAMA3_8B, device(10), None, 2048, None, slots=4)
    assert plan.slots == 4 and MIN_SLOT_CTX <= plan.ctx < 131072 and plan.ctx % 256 == 0
    assert plan.kv_bytes < 9 * GiB


def test_fewer_slots_rather_than_too_little_context_each():
    plan = plan_context(LLAMA3_8B, device(3), None, 2048, None, slots=8)
    assert 1 <= plan.slots < 8 and plan.ctx >= MIN_SLOT_CTX


def test_a_ctx_that_does_not_fit_is_refused_with_the_numbers():
    with pytest.raises(ModelLoadError) as e:
        plan_context(LLAMA3_8B, device(10), 131072, 2048, None)
    message = str(e.value)
    assert "--ctx 131072 does not fit" in message and "16.0 GiB" in message and "10.0 GiB are free" in message
    assert "at most --ctx" in message


def test_an_explicit_snapshot_budget_is_kept_and_the_default_is_capped_by_host_memory(monkeypatch):
    plan = plan_context(LLAMA3_8B, device(40), None, 2048, 4 * GiB)
    assert plan.snapshot_bytes == 4 * GiB and plan.ctx == 131072
    monkeypatch.setattr(memory, "host_memory_bytes", lambda: 8 * GiB)
    assert plan_context(LLAMA3_8B, device(40), None, 2048, None).snapshot_bytes == 4 * GiB


def test_on_the_cpu_the_context_is_the_models_capped_and_snapshots_get_two_gib():
    cpu = SimpleNamespace(weight_dtype=np.float32, free_bytes=lambda: None)
    plan = plan_context(LLAMA3_8B, cpu, None, 256, None, slots=4)
    assert plan.ctx == 8192 and plan.snapshot_bytes == DEFAULT_SNAPSHOT_BYTES and plan.slots == 4
    assert plan_context(LLAMA3_8B, cpu, 20000, 256, None).ctx == 20000
