"""Server settings: one validated dataclass built once from the command line."""
from __future__ import annotations

import math
import shlex
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

from engine.config import speculation_refusal
from engine.core.memory import KV_FLOOR_BYTES, RESERVE_BYTES
from engine.modelfile.rope_config import RopeOverride
from serve.api.sampling_defaults import LLAMA_CPP


@dataclass(frozen=True)
class PreemptSettings:
    enabled: bool = True
    max_wait_s: float = 30.0  # a parked request takes the next period after this; 0 = no limit
    aged_s: float = 4.0  # a waiter this old triggers a park whatever its length (same or higher class)
    min_tokens: int | None = None  # forwarded to the default engine; None = the engine's default
    max_parks: int | None = None
    snapshot_mib: int | None = None

    def engine_args(self) -> list[str]:
        if not self.enabled:
            return ["--no-prefill-preempt"]
        extra = {"--prefill-preempt-min-tokens": self.min_tokens, "--prefill-preempt-max": self.max_parks,
                 "--prefill-preempt-snapshot-mib": self.snapshot_mib}
        return ["--prefill-preempt"] + [a for k, v in extra.items() if v is not None for a in (k, str(v))]


REASONING_FORMATS = ("deepseek", "none")
GPU_START_ROOM = KV_FLOOR_BYTES + RESERVE_BYTES  # what a GPU engine needs beside its weights to start


@dataclass(frozen=True)
class ServerSettings:
    model_path: Path
    host: str = "127.0.0.1"
    port: int = 8080
    engine_cmd: tuple[str, ...] = ()  # empty: the real engine on model_path
    api_key: str | None = None
    ctx: int | None = None
    chunk: int | None = None
    device: str = "auto"
    weights: str | None = None  # forwarded to the default engine: quantized | fp16
    prompt_weights: str | None = None  # forwarded to the default engine: auto | resident | per-step
    preempt: PreemptSettings = field(default_factory=PreemptSettings)
    keepalive_s: float = 5.0
    handshake_timeout_s: float = 300.0
    max_restarts: int = 3
    max_queue: int = 1024  # requests waiting for the engine beyond which new ones are refused (429 / 529); 0: no limit
    max_request_retries: int = 2  # a request running at this many engine deaths fails
    max_body_mb: float | None = None  # MiB; larger request bodies get 413 (None: sized from the context; <= 0: no limit)
    shutdown_grace_s: float = 5.0  # on SIGINT/SIGTERM the running request may finish within this
    shutdown_timeout_s: float = 10.0  # then the engine gets this long to exit after QUIT
    reasoning_format: str = "deepseek"  # a thinking model's <think> text: reasoning_content, or "none": inline
    max_running: int | None = None  # forwarded to the default engine; None = the engine's default
    kv_tokens: int | None = None  # forwarded to the default engine: its KV pool in tokens
    kv_block: int | None = None  # forwarded to the default engine: positions per KV block
    kv_type: str | None = None  # forwarded to the default engine: the cache's element type (engine/core/kv_types.py)
    tp: int | None = None  # forwarded to the default engine: tensor-parallel processes (None: 1)
    prompt_reuse: bool = True  # forwarded to the default engine
    cache_ram_gib: float | None = None  # forwarded to the default engine: its host tier (None: the engine's default)
    gpu_memory_gib: float | None = None  # forwarded to the default engine: the most GPU memory it takes
    expert_slots: int | None = None  # forwarded to the default engine: a MoE layer's device slots (None: its plan)
    decode_interval_ms: float | None = None  # forwarded to the default engine; None = the engine's default
    burst_ms: float | None = None  # forwarded to the default engine: the decoders' wait for short reads (None: its)
    step_tokens: int | None = None  # forwarded to the default engine: prompt rows a step may take (None: its default)
    step_ms: float | None = None  # forwarded to the default engine: a prompt step's time while others decode
    speculative: str | None = None  # forwarded to the default engine: its drafter (off | auto | ngram | draft; None: its default)
    draft_max: int | None = None  # forwarded to the default engine: a draft's most tokens
    draft: Path | None = None  # forwarded to the default engine: --speculative draft's model file
    draft_row_cost: float | None = None  # forwarded to the default engine: a drafted row's cost (None: measured)
    pooling: str | None = None  # forwarded to the default engine: embeddings' pooling (None: as the file says)
    allowed_hosts: tuple[str, ...] | None = None  # Host names accepted beside loopback's (None: not given)
    cors_origins: tuple[str, ...] = ()  # origins of other pages allowed to call this server ("*": any)
    rope: RopeOverride = RopeOverride()  # forwarded to the default engine: rope scaling over the file's
    engines: int = 1  # engine processes behind the one queue (serve/scheduling/engine_router.py)
    gpus: tuple[str, ...] | None = None  # one engine per GPU: CUDA_VISIBLE_DEVICES of each
    # what a request samples with when it leaves a field out (serve/api/sampling_defaults.py fills it at start)
    sampling: dict = field(default_factory=lambda: dict(LLAMA_CPP))
    served_name: str | None = None  # the model's name in the API (--model NAME=PATH; None: the file's stem)
    models: tuple[tuple[str, Path], ...] = ()  # the other models served by name (serve/model_set.py)
    preload: tuple[str, ...] = ()  # of those, the ones loaded at start and kept
    idle_unload_s: float = 300.0  # a model loaded on demand is unloaded after this long without work (0: never)

    def __post_init__(self):
        if not 0 < self.port < 65536:
            raise ValueError(f"--port must be 1..65535, got {self.port}")
        if self.keepalive_s <= 0 or self.handshake_timeout_s <= 0:
            raise ValueError("--keepalive-s and --handshake-timeout-s must be > 0")
        if self.max_queue < 0:
            raise ValueError(f"--max-queue must be >= 0, got {self.max_queue}")
        if self.max_body_mb is not None and not math.isfinite(self.max_body_mb):
            raise ValueError(f"--max-body-mb must be a number of MiB (0 or less: no limit), got {self.max_body_mb}")
        if self.max_request_retries < 1:
            raise ValueError(f"--max-request-retries must be >= 1, got {self.max_request_retries}")
        if self.shutdown_grace_s < 0:
            raise ValueError("--shutdown-grace-s must be >= 0")
        if self.preempt.max_wait_s < 0 or self.preempt.aged_s < 0:
            raise ValueError("--prefill-preempt-max-wait-s and --prefill-preempt-aged-s must be >= 0")
        if self.max_running is not None and self.max_running < 1:
            raise ValueError(f"--max-running must be >= 1, got {self.max_running}")
        if self.cache_ram_gib is not None and self.cache_ram_gib < 0:
            raise ValueError(f"--cache-ram must be >= 0 GiB, got {self.cache_ram_gib:g}")
        if self.decode_interval_ms is not None and self.decode_interval_ms < 0:
            raise ValueError(f"--decode-interval-ms must be >= 0, got {self.decode_interval_ms}")
        if self.burst_ms is not None and self.burst_ms < 0:
            raise ValueError(f"--burst-ms must be >= 0, got {self.burst_ms}")
        if self.step_tokens is not None and self.step_tokens < 1:
            raise ValueError(f"--step-tokens must be >= 1, got {self.step_tokens}")
        if self.step_ms is not None and self.step_ms < 0:
            raise ValueError(f"--step-ms must be >= 0, got {self.step_ms}")
        bad = [f"{k} {v}" for k, v in self.sampling.items() if v < 0 or (k in ("top_p", "min_p") and v > 1)
               or (k == "top_p" and v == 0)]
        if bad:
            raise ValueError(f"sampling defaults out of range: {', '.join(bad)} (temperature and top_k >= 0, "
                             "top_p in (0, 1], min_p in [0, 1])")
        if refusal := speculation_refusal(self.speculative, self.draft, self.draft_row_cost):
            raise ValueError(refusal)
        if self.draft is not None and self.models:
            raise ValueError("--draft serves one model in this version (a draft is of one model's vocabulary)")
        if self.engines < 1:
            raise ValueError(f"--engines must be >= 1, got {self.engines}")
        if self.gpus is not None and len(self.gpus) != self.engines:
            raise ValueError(f"--gpus names {len(self.gpus)} GPUs for {self.engines} engines (one engine per GPU)")
        names = [self.model_name, *(name for name, _ in self.models)]
        if len(set(names)) < len(names):
            raise ValueError(f"two models have the same name: {', '.join(names)} (name them: --model NAME=PATH)")
        if unknown := [name for name in self.preload if name not in names]:
            raise ValueError(f"--preload {unknown[0]!r} is none of the models' names: {', '.join(names)}")
        if self.idle_unload_s < 0:
            raise ValueError(f"--idle-unload-s must be >= 0, got {self.idle_unload_s:g}")
        if self.reasoning_format not in REASONING_FORMATS:
            raise ValueError(f"--reasoning-format must be one of {', '.join(REASONING_FORMATS)}")

    @property
    def model_name(self) -> str:
        return self.served_name or self.model_path.stem

    @property
    def on_gpu(self) -> bool:
        """Whether the engines run on a GPU (--device gpu, or auto on a machine with NVIDIA's driver)."""
        return self.device == "gpu" or (self.device == "auto" and shutil.which("nvidia-smi") is not None)

    def memory_need(self, path: Path) -> int:
        """Bytes of memory an engine of this model would take where it runs. On a GPU: --gpu-memory where
        given, else its file (the weights) and the least room the engine starts with beside them (a KV pool
        and its reserve: engine/kvcache/expert_plan.py's floor, engine/kvcache/sizing.py's reserve); a GPU
        engine without --gpu-memory then takes what the card has free. On the CPU, of host memory: its
        file and its KV pool (as the engine sizes it: --kv-tokens, else four contexts; float32 rows, or
        q8_0's 34 bytes a 32), a tenth more for the rest."""
        if self.on_gpu:
            return self.gpu_memory_bytes or path.stat().st_size + GPU_START_ROOM
        from engine.modelfile.gguf_file import GGUFFile
        from engine.modelfile.model_config import read_config

        cfg = read_config(GGUFFile(str(path), "r"))
        tokens = self.kv_tokens or 4 * (self.ctx or cfg.default_ctx)
        per_value = 34 / 32 if self.kv_type == "q8_0" else 4
        kv = int(2 * cfg.kv_layers * cfg.kv_dim * tokens * per_value)
        return int(1.1 * (path.stat().st_size + kv))

    @property
    def gpu_memory_bytes(self) -> int | None:
        return None if self.gpu_memory_gib is None else round(self.gpu_memory_gib * 2**30)

    def engine_env(self, i: int) -> dict[str, str] | None:
        """What engine i's process gets beside the server's environment: its GPU with --gpus."""
        return None if self.gpus is None else {"CUDA_VISIBLE_DEVICES": self.gpus[i]}

    def engine_command(self) -> list[str]:
        if self.engine_cmd:
            return list(self.engine_cmd)
        cmd = [sys.executable, "-m", "engine", "--serve", "--model", str(self.model_path), "--device", self.device]
        cmd += ["--ctx", str(self.ctx)] if self.ctx else []
        cmd += ["--chunk", str(self.chunk)] if self.chunk else []
        cmd += ["--weights", self.weights] if self.weights else []
        cmd += ["--prompt-weights", self.prompt_weights] if self.prompt_weights else []
        cmd += ["--max-running", str(self.max_running)] if self.max_running else []
        cmd += ["--kv-tokens", str(self.kv_tokens)] if self.kv_tokens else []
        cmd += ["--kv-block", str(self.kv_block)] if self.kv_block else []
        cmd += ["--kv-type", self.kv_type] if self.kv_type else []
        cmd += ["--tp", str(self.tp)] if self.tp else []
        cmd += [] if self.prompt_reuse else ["--no-prompt-reuse"]
        cmd += [] if self.cache_ram_gib is None else ["--cache-ram", f"{self.cache_ram_gib:g}"]
        cmd += [] if self.gpu_memory_gib is None else ["--gpu-memory", f"{self.gpu_memory_gib:g}"]
        cmd += [] if self.expert_slots is None else ["--expert-slots", str(self.expert_slots)]
        cmd += [] if self.decode_interval_ms is None else ["--decode-interval-ms", f"{self.decode_interval_ms:g}"]
        cmd += [] if self.burst_ms is None else ["--burst-ms", f"{self.burst_ms:g}"]
        cmd += [] if self.step_tokens is None else ["--step-tokens", str(self.step_tokens)]
        cmd += [] if self.step_ms is None else ["--step-ms", f"{self.step_ms:g}"]
        cmd += [] if self.speculative is None else ["--speculative", self.speculative]
        cmd += [] if self.draft_max is None else ["--draft-max", str(self.draft_max)]
        cmd += [] if self.draft is None else ["--draft", str(self.draft)]
        cmd += [] if self.draft_row_cost is None else ["--draft-row-cost", f"{self.draft_row_cost:g}"]
        cmd += [] if self.pooling is None else ["--pooling", self.pooling]
        return cmd + self.preempt.engine_args() + self.rope.engine_args()


def split_command(text: str) -> tuple[str, ...]:
    parts = tuple(shlex.split(text))
    if not parts:
        raise ValueError("--engine-cmd is empty")
    return parts
