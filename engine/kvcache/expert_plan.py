"""Whether a mixture-of-experts model's routed experts stay on the GPU or in host memory behind a cache of device
slots (engine/ops/expert_cache.py), from what the file holds and --gpu-memory allows: the dense tensors
(attention, norms, router, shared experts, embeddings, head) and at least a token's experts a layer must fit
the cap beside a working KV pool; the slots take what is left. Read from the file's tensor sizes, before
anything loads."""
from __future__ import annotations

from dataclasses import dataclass

from engine.modelfile.model_config import ModelConfig, ModelLoadError

EXPERT_TENSORS = ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")
KV_FLOOR_BYTES = 1 << 30  # the least a KV pool, the prompt scratch and the allocator's slack are left


@dataclass(frozen=True)
class ExpertPlan:
    slots: int | None  # device slots a MoE layer keeps (None: every expert resident)
    dense_bytes: int  # the file's bytes that stay on the device whatever the plan
    expert_bytes: int  # one expert's gate, up and down, one layer's (the file's bytes)
    layers: int  # the MoE layers

    def describe(self) -> str:
        gib = lambda n: f"{n / 2**30:.2f} GiB"  # noqa: E731
        if self.slots is None:
            return "routed experts on the GPU"
        slots = self.slots * self.layers * self.expert_bytes
        return f"routed experts in host memory, {self.slots} device slots a layer ({gib(slots)}; dense weights " \
               f"{gib(self.dense_bytes)})"


def plan_experts(cfg: ModelConfig, tensors, cap_bytes: int | None, reserve_bytes: int) -> ExpertPlan:
    """tensors: the file's (name, n_bytes) pairs; cap_bytes: --gpu-memory (None: no cap, all resident);
    reserve_bytes: what the engine keeps apart beside the weights (the plan's reserve). ModelLoadError, saying what
    would fit, when not even a token's experts a layer fit beside the dense weights."""
    sizes = dict(tensors)
    experts = {n: b for n, b in sizes.items() if n.split(".")[-2] in EXPERT_TENSORS}
    dense = sum(sizes.values()) - sum(experts.values())
    layers = len({n.split(".")[1] for n in experts})
    if not cfg.n_experts or not layers:
        return ExpertPlan(None, dense, 0, 0)
    per_expert = sum(experts.values()) // (layers * cfg.n_experts)
    if cap_bytes is None or dense + sum(experts.values()) + reserve_bytes + KV_FLOOR_BYTES <= cap_bytes:
        return ExpertPlan(None, dense, per_expert, layers)
    room = cap_bytes - dense - reserve_bytes - KV_FLOOR_BYTES
    slots = min(cfg.n_experts, room // (layers * per_expert)) if room > 0 else 0
    if slots < cfg.n_experts_used:
        need = dense + reserve_bytes + KV_FLOOR_BYTES + cfg.n_experts_used * layers * per_expert
        raise ModelLoadError(
            f"--gpu-memory {cap_bytes / 2**30:.1f} GiB: the model's dense weights ({dense / 2**30:.1f} GiB) and "
            f"{cfg.n_experts_used} experts a layer for a token's route do not fit beside a KV pool; at least "
            f"{need / 2**30:.1f} GiB is needed")
    return ExpertPlan(int(slots), dense, per_expert, layers)
