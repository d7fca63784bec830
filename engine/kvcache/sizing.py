"""How much KV memory there is: on the GPU the pool of KV blocks takes what the weights and the
prompt-chunk scratch leave of the device's memory; requests moved out of the pool (parked reads,
paused requests) go to host memory."""
from __future__ import annotations

from dataclasses import dataclass

from engine.ops.backend import Backend
from engine.modelfile.model_config import ModelConfig, ModelLoadError
from engine.kvcache.kv import kv_row_bytes
from engine.kvcache.prompt_weights import Expansions, Room
from engine.kvcache.state_memory import PARKED_READS, states_made
from engine.core.memory import RESERVE_BYTES, MiB, host_memory_bytes
from engine.core.kv_types import resolve
from engine.core.chunks import DELTA_CHUNK as CHUNK

CTX_ALIGN = 256
DEFAULT_SNAPSHOT_BYTES = 2048 * MiB  # on the CPU, or when the GPU plan is not asked to size it
CPU_POOL_CONTEXTS = 4  # on the CPU the pool holds this many full contexts by default (pages touched only when used)
GPU_CACHE_RAM_BYTES = 8 << 30  # the host tier's default on the GPU (llama.cpp's --cache-ram default), at most
HOST_SHARE_FOR_CACHE = 4  # ... a quarter of the host's memory
STATES_SHARE = 2  # by default a hybrid's running requests' recurrent states take at most 1/STATES_SHARE of the
# GPU memory the weights, the scratch and the reserve leave; the KV pool takes the rest


def scratch_bytes(cfg: ModelConfig, chunk: int) -> int:
    """Activations of one prompt step of `chunk` rows, twice over for the allocator's sake: the fp32 residual,
    fp16 norms, projections and attention output, and the widest of a layer's passing tensors (the dense
    feed-forward's, the routed experts', a Gated DeltaNet layer's); and the rope tables of the longest request."""
    per_token = cfg.dim * (4 + 2 * 6) + cfg.kv_dim * 4 + max(cfg.ffn_dim * 2 * 3, experts_row_bytes(cfg),
                                                               delta_row_bytes(cfg))
    return 2 * chunk * per_token + cfg.vocab_size * 4 + cfg.max_context * cfg.head_dim * 4


def experts_row_bytes(cfg: ModelConfig) -> int:
    """A prompt row's bytes in the routed experts' pass (engine/kernels/moe_launch.py MoeKernels.prompt): for each
    of its k entries the fp16 gate/up, activation and down rows and its place in the grouped order (two int32),
    and its fp16 sum."""
    if not cfg.n_experts:
        return 0
    ffn = cfg.expert_ffn_dim
    return cfg.n_experts_used * ((2 * ffn + ffn + cfg.dim) * 2 + 2 * 4) + cfg.dim * 2


def delta_row_bytes(cfg: ModelConfig) -> int:
    """A prompt row's bytes in a Gated DeltaNet layer (engine/kernels/linear_attention_launch.py delta_net, the
    chunked form): the fp16 in-projection, the fp32 convolution, the chunks' values, keys, inner products, decays
    and output (fp32), and the fp16 gated output."""
    h = cfg.hybrid
    if h is None:
        return 0
    value = h.v_heads * h.dv
    projection = (h.channels + value + 2 * h.v_heads) * 2
    return projection + h.channels * 4 + (2 * h.v_heads * h.dk + h.v_heads * (CHUNK + 1) + value) * 4 + value * 2


@dataclass(frozen=True)
class Running:
    """The requests in the engine at once (--max-running) and what each holds beside its KV rows."""
    count: int = 1
    given: bool = True  # on the command line: refused if their states cannot fit, never lowered
    state_bytes: int = 0  # a running request's recurrent states (a hybrid's two: engine/kvcache/recurrent.py)
    parked: int = PARKED_READS  # reads parked at a time (--prefill-preempt-max-parked; 0 without parks): each keeps
    # its states on the device


@dataclass(frozen=True)
class MemoryPlan:
    ctx: int  # the most positions one request may hold
    blocks: int  # the pool's blocks
    block: int  # positions per block
    kv_bytes: int  # the whole pool
    snapshot_bytes: int  # host memory for parked reads moved out of the pool
    weights_bytes: int | None = None
    free_bytes: int | None = None
    cache_ram_bytes: int = 0  # the host tier for evicted prefix blocks (engine/kvcache/host_tier.py)
    scratch_bytes: int | None = None  # GPU: a prompt step's activations
    cap_bytes: int | None = None  # GPU: --gpu-memory, the most the engine takes
    states_bytes: int = 0  # GPU: the running requests' recurrent states (a hybrid's: engine/kvcache/recurrent.py)
    max_running: int = 1  # requests in the engine at once: --max-running, or fewer where their states do not fit
    expanded_bytes: int = 0  # GPU: the prompt weights kept expanded (engine/kvcache/prompt_weights.py), 0: none

    def split(self) -> str:
        """How the GPU's memory was shared out (the start-up log): weights, KV pool, scratch, reserve."""
        gib = lambda n: f"{n / 2**30:.2f} GiB"  # noqa: E731
        cap = f"of --gpu-memory {gib(self.cap_bytes)}" if self.cap_bytes is not None else f"of {gib(self.free_bytes or 0)} free after the weights"
        states = (f", recurrent states {gib(self.states_bytes)} ({self.max_running} running requests)"
                  if self.states_bytes else "")
        expanded = f", prompt weights expanded {gib(self.expanded_bytes)}" if self.expanded_bytes else ""
        return (f"GPU memory: weights {gib(self.weights_bytes or 0)}{expanded}, KV pool {gib(self.kv_bytes)}{states}, "
                f"prompt scratch "
                f"{gib(self.scratch_bytes or 0)}, reserve {gib(RESERVE_BYTES)} ({cap}); host memory: park snapshots "
                f"up to {gib(self.snapshot_bytes)}, evicted prefix blocks up to {gib(self.cache_ram_bytes)}")

    @property
    def tokens(self) -> int:
        return self.blocks * self.block

    def info(self) -> dict[str, str]:
        out = {"kv_cache_mib": str(self.kv_bytes // MiB), "snapshot_budget_mib": str(self.snapshot_bytes // MiB),
               "cache_ram_mib": str(self.cache_ram_bytes // MiB)}
        if self.weights_bytes is not None:
            out["weights_mib"] = str(self.weights_bytes // MiB)
        if self.cap_bytes is not None:
            out["gpu_memory_mib"] = str(self.cap_bytes // MiB)
        return out


def plan_context(cfg: ModelConfig, backend: Backend, requested: int | None, step_rows: int,
                 snapshot_bytes: int | None, block: int = 64, pool_tokens: int | None = None,
                 cache_ram_bytes: int | None = None, kv_type: str = "auto", cap_bytes: int | None = None,
                 running: Running = Running(), beside_row_bytes: int = 0,
                 expansions: Expansions | None = None) -> MemoryPlan:
    """The pool of KV blocks, the most one request may hold, and the park snapshots' budget (None:
    sized here). CPU: --ctx, else the model's capped at ModelConfig.default_ctx; the pool
    --kv-tokens, else CPU_POOL_CONTEXTS of those; snapshots 2 GiB. GPU: the pool takes what the
    weights, the chunk scratch and a reserve leave (or --kv-tokens, if that fits: else a clear
    refusal with the numbers); a request may hold the model's trained context, or the whole pool
    if that is smaller (--ctx must fit the pool). Snapshots live in host memory: by default one
    request's rows (any read can park), at most half of the host's. The host tier for evicted
    prefix blocks: `cache_ram_bytes`, else beside a GPU 8 GiB (a quarter of the host's memory if
    that is less) and on the CPU none, the pool itself being host memory (a larger --kv-tokens does
    the same). cap_bytes (--gpu-memory): on the GPU, the most the engine takes, weights included; the
    free memory counted is what the weights leave of it. running: on the GPU, the running requests' recurrent
    states (a hybrid's) are set aside before the pool (fit_running: fewer requests by default where they do not
    fit, a refusal where --max-running was given). beside_row_bytes: on the GPU, a position's
    bytes in a pool of as many positions beside this one (a draft model's, loaded already), sized with it.
    expansions: on the GPU, the prompt weights that may be kept expanded, set aside before the pool where their rule
    says (the longest request's KV rows, or --kv-tokens, the scratch and the reserve still fitting beside them)."""
    row = kv_row_bytes(cfg, backend, kv_type)
    free = backend.free_bytes()
    beside = beside_row_bytes if free is not None else 0
    if cache_ram_bytes is None:
        cache_ram_bytes = 0 if free is None else min(GPU_CACHE_RAM_BYTES, host_memory_bytes() // HOST_SHARE_FOR_CACHE)
    if free is None:
        ctx = requested or cfg.default_ctx
        tokens = pool_tokens or CPU_POOL_CONTEXTS * ctx
        if ctx > tokens:
            raise ModelLoadError(f"--ctx {ctx} is larger than the KV pool (--kv-tokens {tokens})")
        blocks = -(-tokens // block)
        return MemoryPlan(ctx, blocks, block, blocks * block * row,
                          snapshot_bytes if snapshot_bytes is not None else DEFAULT_SNAPSHOT_BYTES,
                          cache_ram_bytes=cache_ram_bytes, max_running=running.count)
    weights = int(backend.xp.get_default_memory_pool().used_bytes())
    scratch = scratch_bytes(cfg, step_rows)  # a prompt step's rows (engine/config.py step_budget)
    if cap_bytes is not None:
        if weights + scratch + RESERVE_BYTES > cap_bytes:
            raise ModelLoadError(
                f"--gpu-memory {cap_bytes / 2**30:.1f} GiB is less than the weights ({weights / 2**30:.1f} GiB), a prompt "
                f"step's scratch ({scratch / 2**30:.1f} GiB) and the reserve ({RESERVE_BYTES / 2**30:.1f} GiB) need")
        free = min(free, cap_bytes - weights)
    free_after_weights, expanded = free, 0
    if expansions is not None:
        need = max(requested or cfg.max_context, pool_tokens or 0) * (row + beside) + scratch + RESERVE_BYTES
        if expansions.kept(Room(free, need), running.state_bytes > 0):
            expanded, free = expansions.nbytes, free - expansions.nbytes
    max_running, states_bytes = fit_running(running, free - scratch - RESERVE_BYTES, free, scratch)
    room = free - scratch - states_bytes - RESERVE_BYTES
    fits = max(0, room // ((row + beside) * block))  # blocks
    if resolve(kv_type, backend.weight_dtype).dtype is None:
        # q8_0: a prompt chunk's attention reads one layer's K and V of its sequence widened to fp16
        # (engine/kernels GpuKernels.widen_q8_0), up to the longest context a request may reach
        longest = min(requested or cfg.max_context, fits * block)
        scratch += longest * 2 * cfg.n_kv_heads * cfg.head_dim * 2
        room = free - scratch - states_bytes - RESERVE_BYTES
        fits = max(0, room // ((row + beside) * block))
    if pool_tokens is not None:
        if -(-pool_tokens // block) > fits:
            raise ModelLoadError(
                f"--kv-tokens {pool_tokens} does not fit: they need {pool_tokens * (row + beside) / 2**30:.1f} GiB"
                f"{' (a draft model beside)' if beside else ''}, but with the "
                f"weights loaded ({weights / 2**30:.1f} GiB) {free / 2**30:.1f} GiB are free, of which "
                f"{scratch / 2**30:.1f} GiB go to prompt-chunk scratch and {RESERVE_BYTES / 2**30:.1f} GiB are kept in "
                f"reserve; at most --kv-tokens {fits * block} fits")
        fits = -(-pool_tokens // block)
    if fits * block < 16:
        raise ModelLoadError(f"no room for a KV cache: {free / 2**30:.1f} GiB free after loading the weights, "
                             + short_of_room(scratch, states_bytes))
    if requested is not None and requested > fits * block:
        raise ModelLoadError(f"--ctx {requested} is larger than the KV pool that fits ({fits * block} tokens, "
                             f"{fits * block * row / 2**30:.1f} GiB)")
    ctx = requested or min(cfg.max_context, fits * block // CTX_ALIGN * CTX_ALIGN or fits * block)
    if snapshot_bytes is None:
        snapshot_bytes = min(ctx * row, host_memory_bytes() // 2)
    return MemoryPlan(ctx, fits, block, fits * block * row, snapshot_bytes, weights, free_after_weights,
                      cache_ram_bytes, scratch, cap_bytes, states_bytes, max_running, expanded)


def fit_running(running: Running, room: int, free: int, scratch: int) -> tuple[int, int]:
    """How many requests may run at once on the GPU, given `room` bytes beside the weights, the scratch and the
    reserve, and the bytes their states take: --max-running where nothing is held per request; else, where it was
    given, all of them or a refusal with the most that fits; by default as many as fit in 1/STATES_SHARE of the
    room, up to the default. The states' bytes count the parked reads' and the spare beside the requests' (the
    zero state every request's first two copy, the decode graphs' padding rows', a rewind's): all of them made at
    start, in a pool of their own (engine/kvcache/state_memory.py states_made)."""
    each = running.state_bytes
    if not each:
        return running.count, 0
    spare = states_made(0, running.parked) * each // 2  # (a request holds two)
    room -= spare
    most = max(0, room) // each
    count = running.count if running.given else min(running.count, most // STATES_SHARE)
    if running.given and count >= most:  # (and a KV block's room beside them)
        raise ModelLoadError(
            f"--max-running {count} does not fit: the running requests' recurrent states take "
            f"{each / MiB:.0f} MiB each ({count * each / 2**30:.1f} GiB), but {max(0, room) / 2**30:.1f} GiB "
            f"are left once the weights, the prompt scratch and the reserve have theirs; "
            f"at most --max-running {max(0, most - 1)} fits")
    if count < 1:
        raise ModelLoadError(f"no room for a request's recurrent states ({each / MiB:.0f} MiB) and a KV cache: "
                             f"{free / 2**30:.1f} GiB free after loading the weights, " + short_of_room(scratch, 0))
    return count, count * each + spare


def short_of_room(scratch: int, states: int) -> str:
    """What takes the room a refused plan lacked, and the options that give it back."""
    held = f", the running requests' recurrent states {states / 2**30:.1f} GiB (--max-running)" if states else ""
    return (f"of which a prompt step's scratch takes {scratch / 2**30:.1f} GiB (a smaller --chunk or --step-tokens "
            f"shrinks it){held} and {RESERVE_BYTES / 2**30:.1f} GiB are kept in reserve; a smaller quant of the model "
            "leaves more")
