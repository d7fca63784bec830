"""The engine's configuration (EngineConfig, built once from the command line by engine/cli.py and
read by engine/startup.py) and its defaults."""
from __future__ import annotations

from dataclasses import dataclass, replace

from engine.loop.park_policy import ParkPolicy
from engine.modelfile.model_config import POOLINGS
from engine.modelfile.rope_config import RopeOverride

# prompt tokens per chunk when --chunk is not given, by device: a chunk is also how long a newcomer
# may wait behind a read that parks for it (bench/HISTORY.md, "The default chunk")
DEFAULT_CHUNK = {"cpu": 256, "gpu": 2048}
DEFAULT_MAX_RUNNING = 256
MAX_BLOCK = 64  # the default block size, when the chunk allows it (engine/kvcache/kv.py, bench/HISTORY.md)
# the decoders' steps during a long read aim this far apart: a token's gap p99 <= 50 ms beside a 46.9K read at
# 4 / 16 / 64 decoders on an H100 takes 40 (45: 46-60 ms; 50: 50-66); bench/HISTORY.md, eighteenth session
DEFAULT_DECODE_INTERVAL_MS = 40.0
DEFAULT_STEP_MS = 0.0
DEFAULT_BURST_MS = 1000.0  # the decoders' next token may wait this long for a burst of short reads' first tokens
SPECULATIVE = ("off", "auto", "ngram", "draft")  # auto: the draft model with --draft, else n-grams
DEFAULT_DRAFT_MAX = 8


def speculation_refusal(speculative: str | None, draft, row_cost: float | None) -> str | None:
    """What is wrong with these speculative decoding flags (engine's or server's), or None."""
    if (speculative == "draft" and draft is None) or (draft is not None and speculative not in ("draft", "auto")):
        return "--speculative draft takes its draft model from --draft FILE, and --draft is for --speculative draft or auto"
    if row_cost is not None and not 0 <= row_cost <= 10:
        return f"--draft-row-cost is 0..10, got {row_cost:g}"
    return None
WEIGHT_FORMS = ("quantized", "fp16")


@dataclass(frozen=True)
class EngineConfig:
    model: str | None
    ctx: int | None
    chunk: int | None  # None: DEFAULT_CHUNK of the device, set by for_device() once the backend is chosen
    device: str
    policy: ParkPolicy
    snapshot_budget_given: bool = False  # else the engine sizes it with the KV cache (engine/kvcache/sizing.py)
    cuda_graphs: bool = True  # GPU decode steps as graph replays (engine/runner/decode_graph.py)
    weights: str = "quantized"  # GPU: quantized tensors stay in their blocks; "fp16" expands them at load
    prompt_weights: str = "auto"  # GPU: a prompt step's expanded matrices kept (engine/kvcache/prompt_weights.py)
    max_running: int = DEFAULT_MAX_RUNNING  # requests in the engine at once (memory permitting)
    max_running_given: bool = False  # else fewer where a hybrid's recurrent states do not fit (engine/kvcache/sizing.py)
    kv_block: int | None = None  # positions per KV block (None: default_block(chunk))
    kv_tokens: int | None = None  # the KV pool's size in positions (None: engine/kvcache/sizing.py sizes it)
    cache_ram_gib: float | None = None  # the host tier for evicted prefix blocks (None: engine/kvcache/sizing.py's default)
    gpu_memory_gib: float | None = None  # the most GPU memory the engine takes, weights included (None: the card's free)
    expert_slots: int | None = None  # a MoE layer's device slots for routed experts (None: as --gpu-memory leaves)
    prompt_reuse: bool = True  # the prefix cache: a prompt that starts as an earlier one reads only the rest
    decode_interval_ms: float = DEFAULT_DECODE_INTERVAL_MS  # decode steps in a long chunk's pauses, about this often
    step_tokens: int | None = None  # prompt rows a step may take from several reads (None: step_budget's default)
    step_ms: float = DEFAULT_STEP_MS  # while others decode, a prompt step's rows by its estimated time (0: no bound)
    burst_ms: float = DEFAULT_BURST_MS  # the decoders' wait for short reads' first tokens (engine/loop/step_limits.py)
    rope: RopeOverride = RopeOverride()  # the command line's rope scaling over the file's (engine/modelfile/rope_config.py)
    kv_type: str = "auto"  # the cache's element type (engine/core/kv_types.py)
    tp: int = 1  # tensor-parallel ranks, one process each (engine/parallel/tp_workers.py)
    speculative: str = "off"  # speculative decoding's drafter: off | ngram (engine/runner/ngram_draft.py) | draft
    # (a draft model: engine/runner/draft_model.py)
    draft_max: int = DEFAULT_DRAFT_MAX  # the most tokens a request's draft proposes at a step
    draft: str | None = None  # --speculative draft: the draft model's GGUF (the target's vocabulary)
    draft_row_cost: float | None = None  # a drafted row's cost against a request's share of a step (None: measured)
    pooling: str | None = None  # embeddings' pooling (mean | cls | last) over the file's (engine/runner/pooling.py)

    def __post_init__(self):
        if self.chunk is not None and self.chunk < 1:
            raise ValueError("--chunk must be >= 1")
        if self.ctx is not None and self.ctx < 16:
            raise ValueError("--ctx must be >= 16")
        if self.decode_interval_ms < 0:
            raise ValueError("--decode-interval-ms must be >= 0")
        if self.step_tokens is not None and self.step_tokens < 1:
            raise ValueError("--step-tokens must be >= 1")
        if self.step_ms < 0:
            raise ValueError("--step-ms must be >= 0")
        if self.burst_ms < 0:
            raise ValueError("--burst-ms must be >= 0")
        if self.max_running < 1:
            raise ValueError("--max-running must be >= 1")
        if self.tp < 1:
            raise ValueError(f"--tp must be >= 1, got {self.tp}")
        if self.speculative not in SPECULATIVE or not 1 <= self.draft_max <= 32:
            raise ValueError(f"--speculative is one of {', '.join(SPECULATIVE)} and --draft-max 1..32, got "
                             f"{self.speculative} and {self.draft_max}")
        if refusal := speculation_refusal(self.speculative, self.draft, self.draft_row_cost):
            raise ValueError(refusal)
        if self.pooling not in (None, *POOLINGS):
            raise ValueError(f"--pooling is one of {', '.join(POOLINGS)}, got {self.pooling}")
        if self.chunk is None:  # checked again once the device's default is set
            return
        block = self.block
        if block < 1 or block & (block - 1):
            raise ValueError(f"--kv-block must be a power of two, got {block}")
        if self.chunk % block:
            raise ValueError(f"--chunk {self.chunk} must be a multiple of --kv-block {block} "
                             "(parks and prefix reuse stay block-aligned)")
        if self.cache_ram_gib is not None and self.cache_ram_gib < 0:
            raise ValueError(f"--cache-ram must be >= 0 GiB, got {self.cache_ram_gib:g}")
        if self.gpu_memory_gib is not None and not self.gpu_memory_gib > 0:
            raise ValueError(f"--gpu-memory must be > 0 GiB, got {self.gpu_memory_gib:g}")
        if self.expert_slots is not None and self.expert_slots < 1:
            raise ValueError(f"--expert-slots must be >= 1, got {self.expert_slots}")
        if self.kv_tokens is not None and self.kv_tokens < block:
            raise ValueError(f"--kv-tokens must be at least one block ({block})")

    def for_device(self, backend_name: str) -> "EngineConfig":
        """This config with the device's default chunk where --chunk was not given."""
        return self if self.chunk is not None else replace(self, chunk=DEFAULT_CHUNK[backend_name])

    @property
    def cache_ram_bytes(self) -> int | None:
        return None if self.cache_ram_gib is None else round(self.cache_ram_gib * 2**30)

    @property
    def gpu_memory_bytes(self) -> int | None:
        return None if self.gpu_memory_gib is None else round(self.gpu_memory_gib * 2**30)

    @property
    def block(self) -> int:
        return self.kv_block if self.kv_block is not None else default_block(self.chunk)


def default_block(chunk: int) -> int:
    """The largest power of two up to MAX_BLOCK that divides the chunk."""
    return min(MAX_BLOCK, chunk & -chunk)
