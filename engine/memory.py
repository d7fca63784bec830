"""How much context fits: on the GPU the KV cache takes what the weights, the prompt-chunk
scratch and the park snapshots' budget leave of the device's memory."""
from __future__ import annotations

from dataclasses import dataclass

from engine.backend import Backend
from engine.gguf_model import ModelConfig, ModelLoadError
from engine.kv import kv_row_bytes

MiB = 2**20
RESERVE_BYTES = 1024 * MiB  # cuBLAS workspace, kernels, allocator slack
CTX_ALIGN = 256
DEFAULT_SNAPSHOT_BYTES = 2048 * MiB  # on the CPU, or when the GPU plan is not asked to size it


def scratch_bytes(cfg: ModelConfig, chunk: int) -> int:
    """Activations of one prompt chunk, twice over for the allocator's sake: the fp32 residual,
    fp16 norms, projections, attention output and the feed-forward's widest tensors."""
    per_token = cfg.dim * (4 + 2 * 6) + cfg.kv_dim * 4 + cfg.ffn_dim * 2 * 3
    return 2 * chunk * per_token + cfg.vocab_size * 4


@dataclass(frozen=True)
class MemoryPlan:
    ctx: int
    kv_bytes: int
    snapshot_bytes: int
    weights_bytes: int | None = None
    free_bytes: int | None = None

    def info(self) -> dict[str, str]:
        out = {"kv_cache_mib": str(self.kv_bytes // MiB), "snapshot_budget_mib": str(self.snapshot_bytes // MiB)}
        if self.weights_bytes is not None:
            out["weights_mib"] = str(self.weights_bytes // MiB)
        return out


def plan_context(cfg: ModelConfig, backend: Backend, requested: int | None, chunk: int,
                 snapshot_bytes: int | None) -> MemoryPlan:
    """The context to allocate and the park snapshots' budget (None: sized here). CPU: --ctx,
    else the model's capped at ModelConfig.default_ctx; snapshots 2 GiB. GPU: --ctx if it fits
    (else a clear refusal with the numbers), else the largest that fits, capped at the model's
    trained context; snapshots get as much as the KV cache, so any read can park."""
    row = kv_row_bytes(cfg, backend)
    free = backend.free_bytes()
    if free is None:
        ctx = requested or cfg.default_ctx
        return MemoryPlan(ctx, ctx * row, snapshot_bytes if snapshot_bytes is not None else DEFAULT_SNAPSHOT_BYTES)
    weights = int(backend.xp.get_default_memory_pool().used_bytes())
    scratch = scratch_bytes(cfg, chunk)
    room = free - scratch - RESERVE_BYTES
    kv_room = room - snapshot_bytes if snapshot_bytes is not None else room // 2
    fits = max(0, kv_room // row) // CTX_ALIGN * CTX_ALIGN
    if requested is not None and requested > fits:
        raise ModelLoadError(
            f"--ctx {requested} does not fit: its KV cache needs {requested * row / 2**30:.1f} GiB, but with the "
            f"weights loaded ({weights / 2**30:.1f} GiB) {free / 2**30:.1f} GiB are free, of which "
            f"{scratch / 2**30:.1f} GiB go to prompt-chunk scratch, "
            f"{(room - kv_room) / 2**30:.1f} GiB to the park snapshot budget and {RESERVE_BYTES / 2**30:.1f} GiB "
            f"are kept in reserve; at most --ctx {fits} fits")
    ctx = requested or min(cfg.context_length, fits)
    if ctx < 16:
        raise ModelLoadError(f"no room for a KV cache: {free / 2**30:.1f} GiB free after loading the weights")
    if snapshot_bytes is None:
        snapshot_bytes = min(ctx * row, room - ctx * row)
    return MemoryPlan(ctx, ctx * row, snapshot_bytes, weights, free)
