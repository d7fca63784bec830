"""The memory plan: on a GPU the pool of KV blocks takes what the weights leave, park snapshots go
to host memory; a --ctx or --kv-tokens that does not fit is refused with the numbers. (A stand-in
device reports its memory.)"""
from types import SimpleNamespace

import numpy as np
import pytest

from engine.modelfile.model_config import HybridConfig, ModelConfig, ModelLoadError
from engine.kvcache import sizing as memory
from engine.kvcache.recurrent import state_bytes
from engine.kvcache.state_memory import PARKED_READS, SPARE_STATES
from engine.kvcache.prompt_weights import Expansions
from engine.kvcache.sizing import CPU_POOL_CONTEXTS, DEFAULT_SNAPSHOT_BYTES, Running, plan_context

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


def test_a_large_gpu_pools_what_the_weights_leave_and_a_request_may_hold_the_trained_context():
    plan = plan_context(LLAMA3_8B, device(120), None, 2048, None)
    assert plan.ctx == 131072 and plan.block == 64
    room = 120 * GiB - memory.scratch_bytes(LLAMA3_8B, 2048) - memory.RESERVE_BYTES
    assert plan.kv_bytes == room // (128 * 1024 * 64) * 64 * 128 * 1024  # whole blocks of 128 KiB a position
    assert plan.tokens > 6 * 131072  # many requests share it: nothing is reserved per request
    assert plan.snapshot_bytes == 131072 * 128 * 1024  # in host memory: any read can park
    assert plan.info()["weights_mib"] == "15360"


def test_a_smaller_gpu_caps_a_request_at_the_pool():
    plan = plan_context(LLAMA3_8B, device(10), None, 2048, None)
    assert plan.ctx < 131072 and plan.ctx <= plan.tokens and plan.kv_bytes < 9 * GiB


def test_a_ctx_or_pool_that_does_not_fit_is_refused_with_the_numbers():
    with pytest.raises(ModelLoadError, match="--ctx 131072 is larger than the KV pool that fits"):
        plan_context(LLAMA3_8B, device(10), 131072, 2048, None)
    with pytest.raises(ModelLoadError) as e:
        plan_context(LLAMA3_8B, device(10), None, 2048, None, pool_tokens=131072)
    message = str(e.value)
    assert "--kv-tokens 131072 does not fit" in message and "16.0 GiB" in message and "10.0 GiB are free" in message
    assert "at most --kv-tokens" in message
    assert plan_context(LLAMA3_8B, device(40), None, 2048, None, pool_tokens=8192).tokens == 8192


def test_an_explicit_snapshot_budget_is_kept_and_the_default_is_capped_by_host_memory(monkeypatch):
    plan = plan_context(LLAMA3_8B, device(40), None, 2048, 4 * GiB)
    assert plan.snapshot_bytes == 4 * GiB and plan.ctx == 131072
    monkeypatch.setattr(memory, "host_memory_bytes", lambda: 8 * GiB)
    assert plan_context(LLAMA3_8B, device(40), None, 2048, None).snapshot_bytes == 4 * GiB


def test_on_the_cpu_the_context_is_the_models_capped_and_snapshots_get_two_gib():
    cpu = SimpleNamespace(weight_dtype=np.float32, free_bytes=lambda: None)
    plan = plan_context(LLAMA3_8B, cpu, None, 256, None)
    assert plan.ctx == 8192 and plan.snapshot_bytes == DEFAULT_SNAPSHOT_BYTES
    assert plan.tokens == CPU_POOL_CONTEXTS * 8192
    assert plan_context(LLAMA3_8B, cpu, 20000, 256, None).ctx == 20000
    with pytest.raises(ModelLoadError, match="larger than the KV pool"):
        plan_context(LLAMA3_8B, cpu, 20000, 256, None, pool_tokens=1024)


def test_the_host_tier_gets_eight_gib_beside_a_gpu_a_quarter_of_a_small_host_and_none_on_the_cpu(monkeypatch):
    assert plan_context(LLAMA3_8B, device(40), None, 2048, None).cache_ram_bytes == 8 * GiB
    assert plan_context(LLAMA3_8B, device(40), None, 2048, None, cache_ram_bytes=GiB).cache_ram_bytes == GiB
    cpu = SimpleNamespace(weight_dtype=np.float32, free_bytes=lambda: None)
    assert plan_context(LLAMA3_8B, cpu, None, 256, None).cache_ram_bytes == 0
    monkeypatch.setattr(memory, "host_memory_bytes", lambda: 16 * GiB)
    assert plan_context(LLAMA3_8B, device(40), None, 2048, None).cache_ram_bytes == 4 * GiB


def test_an_8_bit_cache_on_an_h200_plans_a_million_token_request():
    """The issue's plan: the 8B shape's weights (4.6 GiB in Q4_K_M) on an H200 (about 134 GiB free
    after them), --kv-type q8_0 and --ctx 1048576. The pool takes 68 KiB a position (0.53x fp16's
    128 KiB) and beside it the fp16 rows a prompt chunk's attention reads widened: one layer's K and
    V of the longest request (4 GiB at 1M)."""
    h200 = device(134.5, weights_gib=4.6)
    plan = plan_context(LLAMA3_8B, h200, 1 << 20, 2048, None, kv_type="q8_0")
    assert plan.ctx == 1 << 20 and plan.tokens >= 1 << 20
    assert plan.kv_bytes // plan.tokens == 32 * 2 * 8 * 128 * 34 // 32  # 69,632 bytes a position
    widened = (1 << 20) * 2 * 8 * 128 * 2
    room = int(134.5 * GiB) - memory.scratch_bytes(LLAMA3_8B, 2048) - widened - memory.RESERVE_BYTES
    assert plan.tokens == room // (69632 * 64) * 64
    smaller = device(90, weights_gib=4.6)  # where 1M positions of fp16 (128 GiB) cannot fit, q8_0's 68 GiB do
    assert plan_context(LLAMA3_8B, smaller, 1 << 20, 2048, None, kv_type="q8_0").ctx == 1 << 20
    with pytest.raises(ModelLoadError, match="larger than the KV pool that fits"):
        plan_context(LLAMA3_8B, smaller, 1 << 20, 2048, None, kv_type="f16")


def test_gpu_memory_caps_what_the_engine_takes_and_refuses_what_cannot_fit():
    """--gpu-memory 24 on a 141 GiB card: the pool takes what the 15 GiB of weights leave of 24."""
    plan = plan_context(LLAMA3_8B, device(120), None, 2048, None, cap_bytes=24 * GiB)
    room = 9 * GiB - memory.scratch_bytes(LLAMA3_8B, 2048) - memory.RESERVE_BYTES
    assert plan.kv_bytes == room // (128 * 1024 * 64) * 64 * 128 * 1024 and plan.info()["gpu_memory_mib"] == "24576"
    assert "KV pool" in plan.split() and "of --gpu-memory 24.00 GiB" in plan.split()
    assert plan_context(LLAMA3_8B, device(5), None, 2048, None, cap_bytes=24 * GiB).kv_bytes < 5 * GiB  # the card's free
    with pytest.raises(ModelLoadError, match="--gpu-memory 16.0 GiB is less than the weights"):
        plan_context(LLAMA3_8B, device(120), None, 2048, None, cap_bytes=16 * GiB)


NEXT_80B = ModelConfig(arch="qwen3next", name="80b-a3b", n_layers=48, dim=2048, ffn_dim=5120, n_heads=16,
                       n_kv_heads=2, head_dim=256, vocab_size=151936, context_length=262144, rope_base=1e7,
                       norm_eps=1e-6, n_experts=512, n_experts_used=10, expert_ffn_dim=512,
                       hybrid=HybridConfig(n_layers=48, interval=4, conv_kernel=4, k_heads=16, v_heads=32, dk=128,
                                           dv=128, rope_dim=64, shared_ffn_dim=512))


def test_a_hybrids_running_requests_take_half_the_room_by_default_and_the_rest_of_them_wait():
    """The 80B-A3B shape in Q4_K_M on an H100 (48.2 GiB of weights, 30.3 GiB left): 256 running requests'
    recurrent states (two of 75 MiB each) would take 38 GiB, more than there is (the server failed to start
    with "no room for a KV cache"). By default they take at most half of the room, the KV pool the rest."""
    each = 2 * state_bytes(NEXT_80B)
    assert 150 * 2**20 < each < 152 * 2**20
    h100 = device(30.3, weights_gib=48.2)
    plan = plan_context(NEXT_80B, h100, None, 4096, None, running=Running(256, given=False, state_bytes=each))
    spare = (SPARE_STATES + 2 * PARKED_READS) * each // 2  # (the zero state, the padding rows', a rewind's; 4 parked)
    room = int(30.3 * GiB) - memory.scratch_bytes(NEXT_80B, 4096) - memory.RESERVE_BYTES - spare
    assert plan.max_running == room // each // memory.STATES_SHARE and 64 < plan.max_running < 256
    assert plan.states_bytes == plan.max_running * each + spare
    left = room + spare - plan.states_bytes  # what the states leave the pool
    assert plan.kv_bytes <= left < plan.kv_bytes + 64 * 12 * 2 * 2 * 256 * 2  # at most a block short
    assert plan.ctx == 262144 and f"({plan.max_running} running requests)" in plan.split()
    # reads parked at a time keep their states: 16 of them (--prefill-preempt-max-parked) take 12 more than the 4
    more = plan_context(NEXT_80B, h100, None, 4096, None, running=Running(plan.max_running, True, each, parked=16))
    assert more.states_bytes == plan.states_bytes + 12 * each and more.kv_bytes < plan.kv_bytes
    # given on the command line: kept where it fits, refused with the most that fits where it does not
    assert plan_context(NEXT_80B, h100, None, 4096, None, running=Running(150, True, each)).max_running == 150
    with pytest.raises(ModelLoadError, match=rf"--max-running 256 does not fit.*at most --max-running {room // each - 1}"):
        plan_context(NEXT_80B, h100, None, 4096, None, running=Running(256, True, each))
    # a model without recurrent states runs what was asked; so does the CPU, whose states are host memory
    assert plan_context(LLAMA3_8B, device(40), None, 2048, None, running=Running(256, False, 0)).max_running == 256
    cpu = SimpleNamespace(weight_dtype=np.float32, free_bytes=lambda: None)
    assert plan_context(NEXT_80B, cpu, 4096, 256, None, running=Running(256, False, each)).max_running == 256
    with pytest.raises(ModelLoadError, match="no room for a request's recurrent states"):
        plan_context(NEXT_80B, device(1.5, weights_gib=48.2), None, 4096, None, running=Running(256, False, each))


class Counting:
    """NumPy for a launcher, counting the bytes of the arrays it makes (its kernels are not run)."""
    float16, float32, int32, uint8, uint64 = np.float16, np.float32, np.int32, np.uint8, np.uint64

    def __init__(self):
        self.made = 0

    def empty(self, shape, dtype):
        a = np.empty(shape, dtype)  # (untouched: no pages)
        self.made += a.nbytes
        return a


class NoKernels(dict):
    def __missing__(self, name):
        return lambda grid, block, args: None


def test_the_scratch_estimate_covers_what_a_hybrid_moe_prompt_step_makes():
    """The scratch the plan sets aside for a prompt step of 4,096 rows on the 80B-A3B shape covers, twice over, what
    the GPU path's widest passes make: a Gated DeltaNet layer's chunked form (linear_attention_launch.delta_net,
    its in-projection included) and the routed experts' grouped GEMMs (moe_launch.MoeKernels.prompt). (An estimate
    of half the real need let a server at 97 running requests run out of memory on an H100.)"""
    from engine.kernels.linear_attention_launch import Chunks, LinearAttentionLaunchers, StatePointers
    from engine.kernels.moe_launch import MoeKernels
    from engine.kernels.norm_rope_launch import NormRopeLaunchers
    from engine.core.experts import ExpertStack

    n, hy, dim = 4096, NEXT_80B.hybrid, NEXT_80B.dim
    counting = Counting()
    delta = LinearAttentionLaunchers()
    delta.cp, delta.fn = counting, NoKernels()
    proj = counting.empty((n, hy.channels + hy.v_heads * hy.dv + 2 * hy.v_heads), np.float16)  # (its input)
    rows = StatePointers(1, (0, 0, 0, 0), 0, 0, Chunks(n // 64, 0, 0, 0))
    delta.delta_net(proj, SimpleNamespace(a=0, dt_bias=0, conv=0, norm=0), hy, 0, rows, 1e-6)
    assert counting.made == n * memory.delta_row_bytes(NEXT_80B)

    counting = Counting()
    act = NormRopeLaunchers()
    act.cp, act.fn = counting, NoKernels()
    moe = MoeKernels.__new__(MoeKernels)
    moe.kernels, moe.cp, moe.fn = act, counting, NoKernels()
    ffn = NEXT_80B.expert_ffn_dim
    stacks = [ExpertStack("Q4_K", None, 512, rows, cols, table=0) for rows, cols in ((ffn, dim), (ffn, dim), (dim, ffn))]
    h = np.empty((n, dim), np.float16)
    chosen = np.empty((n, NEXT_80B.n_experts_used), np.int32)
    moe.prompt(h, SimpleNamespace(gate=stacks[0], up=stacks[1], down=stacks[2]), chosen, None)
    assert n * memory.experts_row_bytes(NEXT_80B) <= counting.made <= n * memory.experts_row_bytes(NEXT_80B) + 8 * 513

    widest = max(memory.delta_row_bytes(NEXT_80B), memory.experts_row_bytes(NEXT_80B))
    assert memory.scratch_bytes(NEXT_80B, n) >= 2 * n * widest


def test_prompt_weights_kept_expanded_are_set_aside_before_the_pool_and_named_in_the_split():
    """engine/kvcache/prompt_weights.py's rule, applied where the memory is planned: 13 GiB of an 8B's expansions on
    an 80 GB card come out of the pool and show in the start-up line; a --kv-tokens they would leave no room for keeps
    them per step."""
    expansions = Expansions("auto", 13 * GiB)
    kept = plan_context(LLAMA3_8B, device(73, 5), None, 2048, None, expansions=expansions)
    alone = plan_context(LLAMA3_8B, device(73, 5), None, 2048, None)
    assert kept.expanded_bytes == 13 * GiB and alone.expanded_bytes == 0
    assert alone.kv_bytes - kept.kv_bytes == 13 * GiB // (128 * 1024 * 64) * 128 * 1024 * 64
    assert "prompt weights expanded 13.00 GiB" in kept.split() and "expanded" not in alone.split()
    pool = plan_context(LLAMA3_8B, device(73, 5), None, 2048, None, pool_tokens=500_000, expansions=expansions)
    assert pool.expanded_bytes == 0 and pool.tokens >= 500_000
