"""Where a MoE model's routed experts live under --gpu-memory (engine/kvcache/expert_plan.py): all on the GPU
when the file fits the cap beside a KV pool, else as many device slots a layer as the cap leaves after the dense
weights, and a refusal that says what would fit when not even a token's experts a layer fit; --expert-slots taken
as given where it fits, and the experts refused when the host's memory cannot hold them; the KV pool beside them
keeps room for a working context (kv_floor)."""
import pytest

from engine.core.memory import KV_FLOOR_BYTES
from engine.kvcache.expert_plan import OFFLOAD_CONTEXT, kv_floor, plan_experts
from engine.modelfile.model_config import ModelConfig, ModelLoadError

GIB = 1 << 30
EXPERT = 3 << 20  # one expert's gate, up and down in one layer
LAYERS, EXPERTS, USED = 48, 128, 8


def tensors():
    out = [("token_embd.weight", 600 << 20), ("output.weight", 600 << 20)]
    for i in range(LAYERS):
        out += [(f"blk.{i}.attn_q.weight", 8 << 20), (f"blk.{i}.ffn_gate_inp.weight", 1 << 20)]
        out += [(f"blk.{i}.ffn_{x}_exps.weight", EXPERTS * EXPERT // 3) for x in ("gate", "up", "down")]
    return out


def cfg() -> ModelConfig:
    return ModelConfig(arch="qwen3moe", name="a3b", n_layers=LAYERS, dim=2048, ffn_dim=0, n_heads=32, n_kv_heads=4,
                       head_dim=128, vocab_size=151936, context_length=40960, rope_base=1e6, norm_eps=1e-6,
                       n_experts=EXPERTS, n_experts_used=USED)


def test_experts_stay_resident_without_a_cap_or_when_the_file_fits():
    assert plan_experts(cfg(), tensors(), None, GIB).slots is None
    assert plan_experts(cfg(), tensors(), 80 * GIB, GIB).slots is None


def test_a_cap_below_the_file_keeps_as_many_slots_as_it_leaves():
    dense = (600 << 20) * 2 + LAYERS * (9 << 20)
    plan = plan_experts(cfg(), tensors(), 16 * GIB, GIB)
    assert plan.dense_bytes == dense and plan.expert_bytes == EXPERT and plan.layers == LAYERS
    assert plan.slots == (16 * GIB - dense - GIB - KV_FLOOR_BYTES) // (LAYERS * EXPERT)
    assert USED <= plan.slots < EXPERTS and "device slots a layer" in plan.describe()


def test_a_cap_that_cannot_hold_a_token_s_experts_is_refused_saying_what_would_fit():
    with pytest.raises(ModelLoadError, match=r"at least \d+\.\d GiB is needed"):
        plan_experts(cfg(), tensors(), 3 * GIB, GIB)


def test_expert_slots_are_taken_as_asked_where_they_fit_else_refused_saying_how_many_would():
    assert plan_experts(cfg(), tensors(), None, GIB, slots=16).slots == 16  # the CPU: no cap
    assert plan_experts(cfg(), tensors(), 80 * GIB, GIB, slots=16).slots == 16  # fewer than the card would hold
    assert plan_experts(cfg(), tensors(), 80 * GIB, GIB, slots=EXPERTS).slots is None  # a slot for every expert
    with pytest.raises(ModelLoadError, match="at least that many slots"):
        plan_experts(cfg(), tensors(), None, GIB, slots=USED - 1)
    with pytest.raises(ModelLoadError, match=r"at most \d+ fit"):
        plan_experts(cfg(), tensors(), 8 * GIB, GIB, slots=100)
    dense = plan_experts(cfg(), [("token_embd.weight", 1 << 20)], None, GIB)
    assert dense.slots is None and dense.host_bytes == 0
    with pytest.raises(ModelLoadError, match="has no routed experts"):
        plan_experts(ModelConfig(**{**cfg().__dict__, "n_experts": 0}), [("token_embd.weight", 1 << 20)], None, GIB,
                     slots=8)


def test_experts_that_host_memory_cannot_hold_are_refused_at_start():
    plan = plan_experts(cfg(), tensors(), 16 * GIB, GIB, host_bytes=64 * GIB)
    assert plan.host_bytes == LAYERS * EXPERTS * EXPERT and "host memory (18.00 GiB)" in plan.describe()
    with pytest.raises(ModelLoadError, match=r"routed experts \(18\.0 GiB\) stay in host memory, which has 8\.0 GiB"):
        plan_experts(cfg(), tensors(), 16 * GIB, GIB, host_bytes=8 * GIB)
    assert plan_experts(cfg(), tensors(), 80 * GIB, GIB, host_bytes=8 * GIB).slots is None  # all on the GPU: no need


def test_the_kv_pool_beside_offloaded_experts_keeps_room_for_a_working_context():
    row, scratch = 98304, 600 << 20  # the 30B-A3B shape's K and V a position (f16), a 4,096-row prompt step
    assert kv_floor(row, 40960, None, None, scratch) == OFFLOAD_CONTEXT * row + scratch  # ~3.6 GiB, not 1 GiB
    assert kv_floor(row, 40960, 40960, None, scratch) == 40960 * row + scratch  # --ctx asks for more
    assert kv_floor(row, 40960, 2048, None, scratch) == KV_FLOOR_BYTES  # ... or less, never under the floor
    assert kv_floor(row, 40960, None, 65536, scratch) == 65536 * row + scratch  # --kv-tokens
    assert kv_floor(row, 4096, None, None, scratch) == KV_FLOOR_BYTES  # a model trained on a short context
    kv = kv_floor(row, 40960, None, None, scratch)
    dense = (600 << 20) * 2 + LAYERS * (9 << 20)
    plan = plan_experts(cfg(), tensors(), 16 * GIB, GIB, kv_bytes=kv)
    assert plan.slots == (16 * GIB - dense - GIB - kv) // (LAYERS * EXPERT)  # fewer slots than the 1 GiB floor left
    assert plan.slots < plan_experts(cfg(), tensors(), 16 * GIB, GIB).slots
    with pytest.raises(ModelLoadError, match=r"beside a KV pool of 3\.6 GiB.*a smaller --ctx needs less"):
        plan_experts(cfg(), tensors(), 4 * GIB, GIB, kv_bytes=kv)
