"""`strata`: the engine. `strata --serve` speaks the line protocol on stdio;
`strata "a prompt"` (or a prompt on stdin) streams a chat completion to a terminal."""
from __future__ import annotations

import argparse
import sys

from engine.ops.blas_order import prefer_row_invariant_blas

prefer_row_invariant_blas()  # before NumPy loads (the imports below load it); inherited by the TP workers

from engine.config import (DEFAULT_BURST_MS, DEFAULT_CHUNK, DEFAULT_DECODE_INTERVAL_MS,  # noqa: E402
                           DEFAULT_DRAFT_MAX, DEFAULT_STEP_MS, DEFAULT_MAX_RUNNING, MAX_BLOCK, SPECULATIVE,
                           WEIGHT_FORMS, EngineConfig)
from engine.core.kv_types import KV_TYPES  # noqa: E402
from engine.kvcache.prompt_weights import MODES  # noqa: E402
from engine.loop.park_policy import ParkPolicy  # noqa: E402
from engine.modelfile.model_config import POOLINGS  # noqa: E402
from engine.modelfile.rope_config import add_rope_args, rope_from_args  # noqa: E402


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
    p.add_argument("--prompt-weights", choices=MODES, default="auto",
                   help="GPU: a prompt step reads quantized matrices expanded to fp16, kept so from the start "
                        "(resident: 2 bytes a weight beside the blocks) or expanded again each step (per-step); auto: "
                        "resident where that takes at most a quarter of the memory the weights leave and the longest "
                        "request still fits (default)")
    p.add_argument("--pooling", choices=POOLINGS,
                   help="how an embedding request's hidden states are pooled: the mean of the prompt's rows, its "
                        "first (cls) or its last (default: as the model's file says, <arch>.pooling_type; a file "
                        "that says nothing, as a chat model's, serves no embeddings without this flag)")
    p.add_argument("--max-tokens", type=int, default=512, help="terminal mode: tokens to generate")
    p.add_argument("--temperature", type=float, default=0.0, help="terminal mode: 0 = greedy")
    p.add_argument("--seed", type=int, help="terminal mode: sampling seed")
    add_preempt_args(p)
    add_rope_args(p)
    return p


def add_slots_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-running", "--slots", dest="max_running", type=int,
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
    p.add_argument("--gpu-memory", dest="gpu_memory_gib", type=float, metavar="GIB",
                   help="the most GPU memory the engine takes, its weights included (to leave room for other work, "
                        "or to try a smaller card's size); the KV pool takes what the weights leave of it "
                        "(default: all the card has free)")
    p.add_argument("--expert-slots", type=int, metavar="N",
                   help="a mixture of experts' routed experts in host memory behind a cache of N slots a layer on the "
                        "GPU (as llama.cpp's --n-cpu-moe keeps them on the CPU; the same bits): fewer slots leave "
                        "room for the KV pool (default: every expert on the GPU when the model fits --gpu-memory, "
                        "else as many slots as it leaves; on the CPU the cache only counts, for checks)")
    p.add_argument("--decode-interval-ms", type=float, default=DEFAULT_DECODE_INTERVAL_MS,
                   help="while a long prompt is read, the decoding requests get a step about this often: a "
                        "chunk that takes longer pauses between layers for them (default "
                        f"{DEFAULT_DECODE_INTERVAL_MS:g}; 0: a step per chunk)")
    p.add_argument("--burst-ms", type=float, default=DEFAULT_BURST_MS,
                   help="while short prompts (a chunk or less to read) wait, the decoding requests' next token may "
                        "wait up to this long for their first tokens: a burst of newcomers is read first; the next "
                        "burst only after the decoders have had as long at their own pace (default "
                        f"{DEFAULT_BURST_MS:g}; 0: the decode interval always)")
    p.add_argument("--speculative", choices=SPECULATIVE, default="off",
                   help="speculative decoding: ngram drafts tokens from the request's own context, draft has a "
                        "smaller model of the same vocabulary (--draft) propose them, auto the draft model when "
                        "--draft is given, else n-grams; either way they are checked in the request's decode step (the "
                        "text is the same), as many a step as pay for their rows (default: off)")
    p.add_argument("--draft-max", type=int, default=DEFAULT_DRAFT_MAX,
                   help=f"the most tokens a draft proposes at a step (default {DEFAULT_DRAFT_MAX})")
    p.add_argument("--draft", metavar="FILE",
                   help="--speculative draft: the draft model's GGUF, of the target's vocabulary (its KV pool holds "
                        "as many positions as the target's)")
    p.add_argument("--draft-row-cost", type=float,
                   help="what a drafted row costs, against a request's share of a decode step: the drafts' pace "
                        "weighs their expected tokens against it (default: measured on the decode steps; 0: drafts "
                        "are free, every draft as long as --draft-max)")
    p.add_argument("--step-tokens", type=int,
                   help="prompt tokens one step may read from several requests at once, each up to a chunk, where "
                        "the kernels' rows do not depend on the step's shape (the CPU's; default: two chunks)")
    p.add_argument("--step-ms", type=float, default=DEFAULT_STEP_MS,
                   help="while other requests decode, a prompt step takes no more rows than its estimated time "
                        "allows: a request that arrives meanwhile waits for the step in progress (where rows may "
                        f"share a step; default {DEFAULT_STEP_MS:g}; 0: no bound)")


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
                        cuda_graphs=not a.no_cuda_graphs, weights=a.weights, prompt_weights=a.prompt_weights,
                        max_running=DEFAULT_MAX_RUNNING if a.max_running is None else a.max_running,
                        max_running_given=a.max_running is not None,
                        kv_block=a.kv_block, kv_tokens=a.kv_tokens, prompt_reuse=a.prompt_reuse,
                        cache_ram_gib=a.cache_ram_gib, gpu_memory_gib=a.gpu_memory_gib,
                        expert_slots=a.expert_slots, decode_interval_ms=a.decode_interval_ms, burst_ms=a.burst_ms,
                        rope=rope_from_args(a), kv_type=a.kv_type,
                        tp=a.tp, step_tokens=a.step_tokens, step_ms=a.step_ms, speculative=a.speculative,
                        draft_max=a.draft_max,
                        draft=a.draft, draft_row_cost=a.draft_row_cost, pooling=a.pooling)


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
