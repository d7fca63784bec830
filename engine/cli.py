"""`strata`: the engine. `strata --serve` speaks the line protocol on stdio;
`strata "a prompt"` (or a prompt on stdin) streams a chat completion to a terminal."""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, replace

from engine.kv_types import KV_TYPES
from engine.prefill import ParkPolicy
from engine.rope import KINDS as ROPE_KINDS
from engine.rope import RopeOverride

# prompt tokens per chunk when --chunk is not given, by device: a chunk is also how long a newcomer
# may wait behind a read that parks for it (bench/README.md, "The default chunk")
DEFAULT_CHUNK = {"cpu": 256, "gpu": 2048}
DEFAULT_MAX_RUNNING = 256
MAX_BLOCK = 64  # the default block size, when the chunk allows it (engine/kv.py, bench/README.md)
DEFAULT_DECODE_INTERVAL_MS = 50.0
WEIGHT_FORMS = ("quantized", "fp16")


@dataclass(frozen=True)
class EngineConfig:
    model: str | None
    ctx: int | None
    chunk: int | None  # None: DEFAULT_CHUNK of the device, set by for_device() once the backend is chosen
    device: str
    policy: ParkPolicy
    snapshot_budget_given: bool = False  # else the engine sizes it with the KV cache (engine/memory.py)
    cuda_graphs: bool = True  # GPU decode steps as graph replays (engine/decode_graph.py)
    weights: str = "quantized"  # GPU: quantized tensors stay in their blocks; "fp16" expands them at load
    max_running: int = DEFAULT_MAX_RUNNING  # requests in the engine at once (memory permitting)
    kv_block: int | None = None  # positions per KV block (None: default_block(chunk))
    kv_tokens: int | None = None  # the KV pool's size in positions (None: engine/memory.py sizes it)
    cache_ram_gib: float | None = None  # the host tier for evicted prefix blocks (None: engine/memory.py's default)
    prompt_reuse: bool = True  # the prefix cache: a prompt that starts as an earlier one reads only the rest
    decode_interval_ms: float = DEFAULT_DECODE_INTERVAL_MS  # decode steps in a long chunk's pauses, about this often
    rope: RopeOverride = RopeOverride()  # the command line's rope scaling over the file's (engine/rope.py)
    kv_type: str = "auto"  # the cache's element type (engine/kv_types.py)
    tp: int = 1  # tensor-parallel ranks, one process each (engine/tp_workers.py)

    def __post_init__(self):
        if self.chunk is not None and self.chunk < 1:
            raise ValueError("--chunk must be >= 1")
        if self.ctx is not None and self.ctx < 16:
            raise ValueError("--ctx must be >= 16")
        if self.decode_interval_ms < 0:
            raise ValueError("--decode-interval-ms must be >= 0")
        if self.max_running < 1:
            raise ValueError("--max-running must be >= 1")
        if self.tp < 1:
            raise ValueError(f"--tp must be >= 1, got {self.tp}")
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
        if self.kv_tokens is not None and self.kv_tokens < block:
            raise ValueError(f"--kv-tokens must be at least one block ({block})")

    def for_device(self, backend_name: str) -> "EngineConfig":
        """This config with the device's default chunk where --chunk was not given."""
        return self if self.chunk is not None else replace(self, chunk=DEFAULT_CHUNK[backend_name])

    @property
    def cache_ram_bytes(self) -> int | None:
        return None if self.cache_ram_gib is None else round(self.cache_ram_gib * 2**30)

    @property
    def block(self) -> int:
        return self.kv_block if self.kv_block is not None else default_block(self.chunk)


def default_block(chunk: int) -> int:
    """The largest power of two up to MAX_BLOCK that divides the chunk."""
    return min(MAX_BLOCK, chunk & -chunk)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="strata", description=__doc__)
    p.add_argument("prompt", nargs="?", help="a prompt to answer at the terminal (default: read stdin)")
    p.add_argument("--serve", action="store_true", help="speak the line protocol on stdin/stdout")
    p.add_argument("--model", help="GGUF file (default: $STRATA_MODEL, else SmolLM2-135M-Instruct)")
    p.add_argument("--ctx", type=int, help="the most tokens one request may hold (default: on the CPU the model's, "
                                           "capped at 8192; on the GPU the model's, or the pool if smaller)")
    add_slots_arg(p)
    p.add_argument("--kv-tokens", type=int, help="the KV pool shared by all requests, in tokens (default: on the CPU "
                                                 "4 x ctx; on the GPU what the weights leave of its memory)")
    p.add_argument("--chunk", type=int, help=f"prompt tokens per prefill chunk (default: {DEFAULT_CHUNK['cpu']} on the "
                                              f"CPU, {DEFAULT_CHUNK['gpu']} on the GPU)")
    p.add_argument("--device", choices=("auto", "cpu", "gpu"), default="auto")
    p.add_argument("--no-cuda-graphs", action="store_true", help="GPU: decode with eager launches (debugging)")
    p.add_argument("--tp", type=int, default=1, metavar="N",
                   help="tensor parallel over N processes, each holding 1/N of the heads and hidden units "
                        "(the CPU for now: across GPUs it is not yet available)")
    p.add_argument("--weights", choices=WEIGHT_FORMS, default="quantized",
                   help="GPU: keep quantized tensors in their GGUF blocks (default; about the file's size in "
                        "memory) or expand them to fp16 at load (up to 4x larger; the CPU always expands)")
    p.add_argument("--max-tokens", type=int, default=512, help="terminal mode: tokens to generate")
    p.add_argument("--temperature", type=float, default=0.0, help="terminal mode: 0 = greedy")
    p.add_argument("--seed", type=int, help="terminal mode: sampling seed")
    add_preempt_args(p)
    add_rope_args(p)
    return p


def add_rope_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("rope scaling (default: the model file's)")
    g.add_argument("--rope-scaling", choices=ROPE_KINDS, help="none, linear (position interpolation) or yarn")
    g.add_argument("--rope-scale", type=float, metavar="N", help="the context's scaling factor: the rotation "
                                                                 "frequencies are divided by N")
    g.add_argument("--rope-freq-base", type=float, metavar="N", help="RoPE's base frequency")
    g.add_argument("--yarn-orig-ctx", type=int, metavar="N", help="YaRN: the context the model was trained at")


def rope_from_args(a: argparse.Namespace) -> RopeOverride:
    return RopeOverride(a.rope_scaling, a.rope_scale, a.rope_freq_base, a.yarn_orig_ctx)


def add_slots_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-running", "--slots", dest="max_running", type=int, default=DEFAULT_MAX_RUNNING,
                   help="requests in the engine at once, reading or decoding (their decode steps run as one "
                        f"batch); memory is the real limit: requests hold KV blocks, not slots (default "
                        f"{DEFAULT_MAX_RUNNING}; --slots is the old name)")
    p.add_argument("--kv-type", choices=KV_TYPES, default="auto",
                   help="the KV cache's element type: auto (float32 on the CPU, float16 on the GPU), f32, f16, or "
                        "q8_0 (8-bit with a float16 scale per 32 values: 0.27x float32's memory, 0.53x float16's; "
                        "CPU and GPU)")
    p.add_argument("--kv-block", type=int, help="positions per KV block: a power of two dividing --chunk "
                                                f"(default: {MAX_BLOCK}, or the chunk's largest such divisor)")
    p.add_argument("--prompt-reuse", action=argparse.BooleanOptionalAction, default=True,
                   help="the prefix cache: a prompt that starts with blocks another request read (finished, "
                        "running or parked) reads only the rest, from a chunk boundary (default: on)")
    p.add_argument("--cache-ram", dest="cache_ram_gib", type=float, metavar="GIB",
                   help="host memory for prefix-cache blocks evicted from the KV pool, copied back when their "
                        "prompt comes again instead of read again (default: on the GPU 8, at most a quarter of "
                        "the host's memory; on the CPU 0, the pool being host memory already)")
    p.add_argument("--decode-interval-ms", type=float, default=DEFAULT_DECODE_INTERVAL_MS,
                   help="while a long prompt is read, the decoding requests get a step about this often: a "
                        "chunk that takes longer pauses between layers for them (default "
                        f"{DEFAULT_DECODE_INTERVAL_MS:g}; 0: a step per chunk)")


def add_preempt_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("prefill preemption")
    g.add_argument("--prefill-preempt", action=argparse.BooleanOptionalAction, default=True,
                   help="park a read at a chunk boundary on YIELD (default: on)")
    g.add_argument("--prefill-preempt-min-tokens", type=int, default=ParkPolicy.min_tokens)
    g.add_argument("--prefill-preempt-max", type=int, default=ParkPolicy.max_parks, help="parks per request")
    g.add_argument("--prefill-preempt-max-parked", type=int, default=ParkPolicy.max_parked,
                   help="parked reads at a time")
    g.add_argument("--prefill-preempt-snapshot-mib", type=int,
                   help="one budget over the parked reads' snapshots in host memory (default: 2048 on the "
                        "CPU; on the GPU one slot's KV rows, so that any read can park)")


def policy_from_args(a: argparse.Namespace) -> ParkPolicy:
    return ParkPolicy(enabled=a.prefill_preempt, min_tokens=a.prefill_preempt_min_tokens,
                      max_parks=a.prefill_preempt_max, max_parked=a.prefill_preempt_max_parked,
                      budget_bytes=ParkPolicy.budget_bytes if a.prefill_preempt_snapshot_mib is None
                      else a.prefill_preempt_snapshot_mib << 20)


def config_from_args(a: argparse.Namespace) -> EngineConfig:
    return EngineConfig(a.model, a.ctx, a.chunk, a.device, policy_from_args(a),
                        snapshot_budget_given=a.prefill_preempt_snapshot_mib is not None,
                        cuda_graphs=not a.no_cuda_graphs, weights=a.weights, max_running=a.max_running,
                        kv_block=a.kv_block, kv_tokens=a.kv_tokens, prompt_reuse=a.prompt_reuse,
                        cache_ram_gib=a.cache_ram_gib,
                        decode_interval_ms=a.decode_interval_ms, rope=rope_from_args(a), kv_type=a.kv_type,
                        tp=a.tp)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        config = config_from_args(args)
    except ValueError as e:
        print(f"strata: {e}", file=sys.stderr)
        return 2
    try:
        from engine.startup import serve, chat  # heavy imports after argument errors are reported

        return serve(config) if args.serve else chat(config, args)
    except KeyboardInterrupt:  # Ctrl+C at a terminal: stop quietly (the server's engine never sees one)
        print(file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
