"""Whether a mixture-of-experts model's routed experts stay on the GPU or in host memory behind a cache of device
slots (engine/ops/expert_cache.py), from what the file holds and --gpu-memory allows: the dense tensors
(attention, norms, router, shared experts, embeddings, head) and at least a token's experts a layer must fit
the cap beside a KV pool that holds a working context (kv_floor: OFFLOAD_CONTEXT positions unless --ctx says); the
slots take what is left. Read from the file's tensor sizes, before
anything loads."""
from __future__ import annotations

from dataclasses import dataclass

from engine.core.memory import KV_FLOOR_BYTES
from engine.modelfile.model_config import ModelConfig, ModelLoadError

EXPERT_TENSORS = ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")
OFFLOAD_CONTEXT = 32768  # positions the KV pool keeps room for when the experts move out (agents read long prompts)


def kv_floor(row_bytes: int, max_context: int, ctx: int | None, pool_tokens: int | None, scratch_bytes: int) -> int:
    """The device bytes the slots leave to the KV pool and a prompt step's scratch: room for --ctx positions, else
    OFFLOAD_CONTEXT (the model's context if shorter), --kv-tokens where more, and never under KV_FLOOR_BYTES.
    row_bytes: one position's K and V over all layers."""
    tokens = max(ctx or min(max_context, OFFLOAD_CONTEXT), pool_tokens or 0)
    return max(KV_FLOOR_BYTES, tokens * row_bytes + scratch_bytes)


@dataclass(frozen=True)
class ExpertPlan:
    slots: int | None  # device slots a MoE layer keeps (None: every expert resident)
    dense_bytes: int  # the file's bytes that stay on the device whatever the plan
    expert_bytes: int  # one expert's gate, up and down, one layer's (the file's bytes)
    layers: int  # the MoE layers
    experts: int = 0  # routed experts a layer

    @property
    def host_bytes(self) -> int:
        """What the routed experts take in host memory: every one of them, whatever the slots (the file's bytes)."""
        return self.expert_bytes * self.layers * self.experts if self.slots is not None else 0

    def need(self, fixed: int, slots: int) -> int:
        """Device bytes with `slots` slots a layer beside `fixed` bytes (dense weights, reserve, the least KV pool)."""
        return fixed + slots * self.layers * self.expert_bytes

    def describe(self) -> str:
        gib = lambda n: f"{n / 2**30:.2f} GiB"  # noqa: E731
        if self.slots is None:
            return "routed experts on the GPU"
        slots = self.slots * self.layers * self.expert_bytes
        return f"routed experts in host memory ({gib(self.host_bytes)}), {self.slots} device slots a layer of " \
               f"{self.experts} ({gib(slots)}; dense weights {gib(self.dense_bytes)})"


def plan_experts(cfg: ModelConfig, tensors, cap_bytes: int | None, reserve_bytes: int, slots: int | None = None,
                 host_bytes: int | None = None, kv_bytes: int = KV_FLOOR_BYTES) -> ExpertPlan:
    """tensors: the file's (name, n_bytes) pairs; cap_bytes: --gpu-memory or the card's free memory (None: no cap, on
    the CPU); reserve_bytes: what the engine keeps apart beside the weights (the plan's reserve); slots: --expert-slots
    (None: as many as the cap leaves, every expert resident when the file fits); host_bytes: the host memory left for
    the experts (None: not checked); kv_bytes: what the KV pool and the scratch keep beside them (kv_floor).
    ModelLoadError, saying what would fit, when not even a token's experts a layer
    fit beside the dense weights, when the slots asked for do not, or when the experts fit the host's memory neither."""
    sizes = dict(tensors)
    experts = {n: b for n, b in sizes.items() if n.split(".")[-2] in EXPERT_TENSORS}
    dense = sum(sizes.values()) - sum(experts.values())
    layers = len({n.split(".")[1] for n in experts})
    if not cfg.n_experts or not layers:
        if slots is not None:
            raise ModelLoadError(f"--expert-slots {slots}: {cfg.name} has no routed experts (a mixture of experts' "
                                 "layers only)")
        return ExpertPlan(None, dense, 0, 0)
    per_expert = sum(experts.values()) // (layers * cfg.n_experts)
    plan = ExpertPlan(None, dense, per_expert, layers, cfg.n_experts)
    fixed = dense + reserve_bytes + kv_bytes  # what stays on the device whatever the slots
    if slots is None:
        if cap_bytes is None or fixed + sum(experts.values()) <= cap_bytes:
            return plan
        room = cap_bytes - fixed
        slots = min(cfg.n_experts, room // (layers * per_expert)) if room > 0 else 0
        if slots < cfg.n_experts_used:
            raise ModelLoadError(
                f"--gpu-memory {cap_bytes / 2**30:.1f} GiB: the model's dense weights ({dense / 2**30:.1f} GiB) and "
                f"{cfg.n_experts_used} experts a layer for a token's route do not fit beside a KV pool of "
                f"{kv_bytes / 2**30:.1f} GiB; at least {plan.need(fixed, cfg.n_experts_used) / 2**30:.1f} GiB is needed"
                + (" (a smaller --ctx needs less)" if kv_bytes > KV_FLOOR_BYTES else ""))
    elif slots < cfg.n_experts_used:
        raise ModelLoadError(f"--expert-slots {slots}: a token's route takes {cfg.n_experts_used} experts a layer; "
                             f"at least that many slots are needed")
    elif slots >= cfg.n_experts:
        return plan  # every expert has a slot: resident
    elif cap_bytes is not None and plan.need(fixed, slots) > cap_bytes:
        most = (cap_bytes - fixed) // (layers * per_expert)
        raise ModelLoadError(f"--expert-slots {slots}: {slots} slots a layer need "
                             f"{plan.need(fixed, slots) / 2**30:.1f} GiB of the GPU's {cap_bytes / 2**30:.1f} GiB" + (
                                 f"; at most {most} fit" if most >= cfg.n_experts_used else ""))
    plan = ExpertPlan(int(slots), dense, per_expert, layers, cfg.n_experts)
    if host_bytes is not None and plan.host_bytes > host_bytes:
        raise ModelLoadError(
            f"the routed experts ({plan.host_bytes / 2**30:.1f} GiB) stay in host memory, which has "
            f"{host_bytes / 2**30:.1f} GiB left: free host memory, or give the engine a GPU that holds the whole model "
            f"({(fixed + sum(experts.values())) / 2**30:.1f} GiB)")
    return plan
