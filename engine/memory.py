"""How much context fits: on the GPU the slots' KV rows take what the weights and the prompt-chunk
scratch leave of the device's memory; parked reads moved out of their slots go to host memory."""
from __future__ import annotations

import os
from dataclasses import dataclass

from engine.backend import Backend
from engine.gguf_model import ModelConfig, ModelLoadError
from engine.kv import kv_row_bytes

MiB = 2**20
RESERVE_BYTES = 1024 * MiB  # cuBLAS workspace, kernels, allocator slack
CTX_ALIGN = 256
DEFAULT_SNAPSHOT_BYTES = 2048 * MiB  # on the CPU, or when the GPU plan is not asked to size it
MIN_SLOT_CTX = 4096  # on the GPU, fewer slots rather than less context than this each


def scratch_bytes(cfg: ModelConfig, chunk: int) -> int:
    """Activations of one prompt chunk, twice over for the allocator's sake: the fp32 residual,
    fp16 norms, projections, attention output and the feed-forward's widest tensors."""
    per_token = cfg.dim * (4 + 2 * 6) + cfg.kv_dim * 4 + cfg.ffn_dim * 2 * 3
    return 2 * chunk * per_token + cfg.vocab_size * 4


@dataclass(frozen=True)
class MemoryPlan:
    ctx: int  # per slot
    kv_bytes: int  # all slots
    snapshot_bytes: int  # host memory for parked reads moved out of their slots
    slots: int = 1
    weights_bytes: int | None = None
    free_bytes: int | None = None

    def info(self) -> dict[str, str]:
        out = {"kv_cache_mib": str(self.kv_bytes // MiB), "snapshot_budget_mib": str(self.snapshot_bytes // MiB)}
        if self.weights_bytes is not None:
            out["weights_mib"] = str(self.weights_bytes // MiB)
        return out


def host_memory_bytes() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 16 << 30


def plan_context(cfg: ModelConfig, backend: Backend, requested: int | None, chunk: int,
                 snapshot_bytes: int | None, slots: int = 1) -> MemoryPlan:
    """The context of each slot and the park snapshots' budget (None: sized here). CPU: --ctx,
    else the model's capped at ModelConfig.default_ctx; snapshots 2 GiB. GPU: the KV rows of all
    slots take what the weights, the chunk scratch and a reserve leave: --ctx if it fits (else a
    clear refusal with the numbers), else the largest that fits, capped at the model's trained
    context; fewer slots than asked when each would get less than MIN_SLOT_CTX. Snapshots live in
    host memory: by default one slot's rows (any read can park), at most half of the host's."""
    row = kv_row_bytes(cfg, backend)
    free = backend.free_bytes()
    if free is None:
        ctx = requested or cfg.default_ctx
        return MemoryPlan(ctx, slots * ctx * row,
                          snapshot_bytes if snapshot_bytes is not None else DEFAULT_SNAPSHOT_BYTES, slots)
    weights = int(backend.xp.get_default_memory_pool().used_bytes())
    scratch = scratch_bytes(cfg, chunk)
    room = free - scratch - RESERVE_BYTES
    rows_fit = max(0, room // row)  # positions over all slots
    floor = min(cfg.context_length, requested or MIN_SLOT_CTX)
    if slots > 1 and rows_fit // slots < floor:
        slots = max(1, rows_fit // max(floor, 1))
    fits = rows_fit // slots // CTX_ALIGN * CTX_ALIGN
    if requested is not None and requested > fits:
        raise ModelLoadError(
            f"--ctx {requested} does not fit: {slots} slot(s) of it need {slots * requested * row / 2**30:.1f} GiB "
            f"of KV rows, but with the weights loaded ({weights / 2**30:.1f} GiB) {free / 2**30:.1f} GiB are free, "
            f"of which {scratch / 2**30:.1f} GiB go to prompt-chunk scratch and {RESERVE_BYTES / 2**30:.1f} GiB "
            f"are kept in reserve; at most --ctx {fits} fits (or fewer --slots)")
    ctx = requested or min(cfg.context_length, fits)
    if ctx < 16:
        raise ModelLoadError(f"no room for a KV cache: {free / 2**30:.1f} GiB free after loading the weights")
    if snapshot_bytes is None:
        snapshot_bytes = min(ctx * row, host_memory_bytes() // 2)
    return MemoryPlan(ctx, slots * ctx * row, snapshot_bytes, slots, weights, free)
