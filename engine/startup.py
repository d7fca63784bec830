"""Build the runner from an EngineConfig, then serve the protocol or chat at a terminal."""
from __future__ import annotations

import gc
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

from protocol.codec import encode
from protocol.messages import START_REFUSED, Err
from engine.ops.backend import select_backend
from engine.ops.host_pages import plain_pages
from engine.config import EngineConfig
from engine.modelfile.gguf_file import GGUFFile, GGUFFormatError
from engine.modelfile.model_config import ModelLoadError, file_pooling, read_config
from engine.kernels.model_parts import ModelKernels
from engine.model.weights import expanded_matrices, expansion_bytes, keep_expansions, load_model
from engine.loop.loop import run_loop
from engine.loop.step_limits import StepLimits
from engine.core.chunks import step_budget
from engine.kvcache.expert_plan import kv_floor, plan_experts
from engine.core.memory import RESERVE_BYTES, available_memory, out_of_memory
from engine.kvcache.recurrent import state_bytes
from engine.kvcache.kv import kv_row_bytes
from engine.kvcache.prompt_weights import Expansions, describe
from engine.kvcache.sizing import Running, plan_context, scratch_bytes
from engine.modelfile.model_path import ModelNotFound, resolve_model_path
from engine.loop.park_policy import ParkPolicy
from engine.runner.draft_model import DraftModel, open_draft
from engine.runner.escaped_prompt import PromptEscapes
from engine.runner.runner import ModelRunner
from engine.parallel.tp_workers import TensorParallelRunner, WorkerSpec
from engine.modelfile.grammar_tokenizer import GrammarTokenizer
from engine.core.kv_types import check_kv_type
from engine.modelfile.tokenizer import GGUFTokenizer



def log(text: str) -> None:
    print(f"strata: {text}", file=sys.stderr, flush=True)


def build_runner(config: EngineConfig) -> tuple[ModelRunner, GGUFTokenizer, ParkPolicy]:
    """The runner, its tokenizer, and the park policy with its snapshot budget sized to the device."""
    path = resolve_model_path(config.model)
    started, stages = time.monotonic(), {}  # seconds each start-up stage took, logged below

    def lap(stage: str) -> None:
        stages[stage] = time.monotonic() - started - sum(stages.values())

    reader = GGUFFile(str(path), "r")
    # (a draft's file, read once: its kernels are built beside the model's, and open_draft checks it)
    draft_file = GGUFFile(config.draft, "r") if config.draft and os.path.isfile(config.draft) else None
    backend = select_backend(config.device, model_kernels(reader, draft_file))
    lap("backend")  # on a GPU, the model's kernels are compiled from here on, beside the weights' upload, on a
    # first start (engine/kernels/build.py), else read from the cache
    config = config.for_device(backend.name)
    cap = config.gpu_memory_bytes if backend.name == "gpu" else None
    # a MoE model larger than the cap (or the card) keeps its routed experts in host memory behind device slots;
    # refused, saying what would fit, when not even a token's experts fit (engine/kvcache/expert_plan.py)
    # (--expert-slots: a cache of that many; on the CPU, where both are host memory, the cache only counts)
    gpu = backend.name == "gpu"
    # (beside a KV pool of OFFLOAD_CONTEXT positions, or --ctx's, and a prompt step's scratch)
    file_cfg, step_rows = read_config(reader), step_budget(config.step_tokens, config.chunk)
    kv_room = kv_floor(kv_row_bytes(file_cfg, backend, config.kv_type), file_cfg.max_context, config.ctx,
                       config.kv_tokens, scratch_bytes(file_cfg, step_rows))
    experts = plan_experts(file_cfg, [(t.name, int(t.n_bytes)) for t in reader.tensors],
                           (cap or backend.free_bytes()) if gpu else None, RESERVE_BYTES, config.expert_slots,
                           available_memory() if gpu else None, kv_room)
    if experts.slots is not None:
        log(experts.describe() if gpu else f"routed experts behind a cache of {experts.slots} slots a layer "
            "(--expert-slots; on the CPU the same memory: the cache's counts and checks only)")
    elif cap is not None and os.path.getsize(path) > cap:  # refused before the weights fill the card
        raise ModelLoadError(f"the model's weights ({os.path.getsize(path) / 2**30:.1f} GiB in its file) do not fit "
                             f"--gpu-memory {cap / 2**30:.1f} GiB (only a mixture of experts' routed experts can stay "
                             "in host memory)")
    draft = open_draft(config.draft, reader, backend.name, config.tp, draft_file) if config.draft else None
    # (checked before anything loads)
    log(f"loading {path} on {backend.device_name}")

    workers, conns = start_workers(config, str(path), backend.name)  # loading their shards beside this one
    with ThreadPoolExecutor(1, thread_name_prefix="tokenizer") as beside:
        building = beside.submit(GGUFTokenizer, reader)  # the vocabulary is read while the weights load
        cfg, weights, _ = load_model(str(path), backend, keep_blocks=config.weights == "quantized", rope=config.rope,
                                     reader=reader, shard=(0, config.tp) if config.tp > 1 else None,
                                     expert_slots=experts.slots)
        TensorParallelRunner.wait_ready(conns)
        lap("weights")
        tokenizer = building.result()
    lap("tokenizer after the weights")
    if backend.name == "gpu":
        backend.ready()
        lap("kernels after the weights")
        reader.release_pages()  # the weights are on the device (or an expert cache's page-locked copy): the file's
        # pages leave this process's resident memory (they stay in the page cache)
    check_kv_type(config.kv_type, backend.name, cfg.head_dim)
    drafted = draft_weights(draft, path, (cfg, weights), backend, config) if draft is not None else None
    if drafted is not None:
        lap("draft model's weights")
    states = 2 * state_bytes(cfg)  # a running request's recurrent states (a hybrid's; 0 for other models)
    parked = config.policy.max_parked if config.policy.enabled else 0  # reads parked at a time, their states kept
    plan = plan_context(cfg, backend, config.ctx, step_rows,
                        config.policy.budget_bytes if config.snapshot_budget_given else None, config.block,
                        config.kv_tokens, config.cache_ram_bytes, config.kv_type,
                        cap, Running(config.max_running, config.max_running_given, states, parked),
                        kv_row_bytes(drafted[0], backend, config.kv_type) if drafted else 0,
                        Expansions(config.prompt_weights, expansion_bytes(expanded_matrices(weights.layers)), config.tp)
                        if backend.name == "gpu" and config.weights == "quantized" else None)
    if plan.expanded_bytes:  # before the KV pool takes the rest
        keep_prompt_weights(weights, backend, plan.expanded_bytes)
        lap("prompt weights")
    if backend.name == "gpu":
        log(plan.split())
    elif config.gpu_memory_gib is not None:
        log("--gpu-memory applies to a GPU: ignored on the CPU")
    if plan.max_running < config.max_running:
        log(f"up to {plan.max_running} requests run at once (not {config.max_running}): each holds "
            f"{states / 2**20:.0f} MiB of recurrent states, which take at most half of the memory the "
            "weights leave by default; the others wait their turn (--max-running sets it, the KV pool shrinks)")
    pooling = config.pooling or file_pooling(reader, cfg.arch)  # embeddings' (engine/runner/pooling.py)
    args = (cfg, weights, backend, plan.ctx, config.chunk, tokenizer.end_ids, str(path),
            plan.info() | {"weights": config.weights if backend.name == "gpu" else "float32", "pooling": pooling,
                           "dim": str(cfg.dim)},
            config.cuda_graphs, plan.max_running, plan.blocks, plan.block, plan.cache_ram_bytes, config.kv_type, parked)
    # (the KV pool and the warm-up's arrays on plain pages, as the weights: engine/ops/host_pages.py)
    with plain_pages(backend.name == "cpu"):
        runner = ModelRunner(*args) if config.tp == 1 else \
            TensorParallelRunner(*args, world=config.tp, workers=workers, conns=conns)
        runner.grammars = GrammarTokenizer(tokenizer, cfg.vocab_size)
        runner.draft_max = config.draft_max if config.speculative != "off" and runner.speculates else 0
        runner.escapes = PromptEscapes(tokenizer) if runner.draft_max else None  # the n-gram drafts' escaped view
        runner.row_cost.fixed = config.draft_row_cost
        if draft is not None:
            runner.draft_model = load_draft(draft, runner, drafted, config)
            lap("draft model")
        runner.pooling = pooling
        policy = replace(config.policy, budget_bytes=plan.snapshot_bytes)
        lap("pool")
        runner.warm_up()
        lap("warm-up")
    if cfg.rope.active:
        log(f"rope scaling: {cfg.rope.describe()} (base {cfg.rope_base:g}; the model serves up to {cfg.max_context} tokens)")
    log(f"loaded {cfg.name} ({cfg.n_layers} layers, {runner.kv.type.name} KV pool of {plan.tokens} tokens in blocks of {plan.block} "
        f"({plan.kv_bytes / 2**30:.2f} GiB), up to {plan.ctx} tokens a request, "
        f"park snapshots up to {plan.snapshot_bytes / 2**30:.2f} GiB, evicted prefix blocks up to "
        f"{plan.cache_ram_bytes / 2**30:.2f} GiB in host memory) in {time.monotonic() - started:.1f}s ("
        + ", ".join(f"{name} {seconds:.1f}s" for name, seconds in stages.items()) + ")")
    return runner, tokenizer, policy


def keep_prompt_weights(weights, backend, expansions: int) -> None:
    """The prompt steps' quantized matrices expanded once and kept, where the memory plan set room aside for them
    (engine/kvcache/prompt_weights.py)."""
    began = time.monotonic()
    kept = keep_expansions(backend, weights.layers)
    backend.synchronize()
    log(describe(expansions, len(kept), time.monotonic() - began))


def model_kernels(reader: GGUFFile, draft: GGUFFile | None) -> ModelKernels:
    """The kernels the model needs, and a draft model's beside them (--draft: built at start too)."""
    kernels = ModelKernels.of(read_config(reader), reader)
    if draft is None:  # (a missing draft is refused by open_draft, saying so)
        return kernels
    return replace(kernels, beside=(ModelKernels.of(read_config(draft), draft),))


def draft_weights(reader: GGUFFile, path, target: tuple, backend, config: EngineConfig) -> tuple:
    """--speculative draft's config and weights: the target's own (cfg, weights) when it is the target's file (one
    copy in memory), else loaded, on a GPU before the memory plan, which counts them (quantized blocks as the
    target's are, --weights), on the CPU in float32."""
    if config.tp == 1 and os.path.samefile(reader.path, path):
        return target
    keep = backend.name == "gpu" and config.weights == "quantized"
    return load_model(reader.path, backend, keep_blocks=keep, reader=reader)[:2]


def load_draft(reader: GGUFFile, runner: ModelRunner, drafted: tuple, config: EngineConfig) -> DraftModel:
    """--speculative draft: the draft model (engine/runner/draft_model.py) over its weights (draft_weights) and a KV
    pool of as many positions as the target's (planned beside it on a GPU)."""
    same = drafted[1] is runner.model.w
    draft = DraftModel.load(reader, runner, drafted)
    kv = draft.kv
    log(f"draft model {draft.cfg.name} ({draft.cfg.n_layers} layers{', the target itself' if same else ''}) proposes "
        f"up to {config.draft_max} tokens a step; its {kv.type.name} KV pool of {kv.usable * kv.block_size} tokens in "
        f"blocks of {kv.block_size} ({kv.usable * kv.block_bytes / 2**30:.2f} GiB, as many tokens as the target's)")
    return draft


def start_workers(config: EngineConfig, path: str, device: str) -> tuple[list, list]:
    """The tensor-parallel ranks past 0 as processes (engine/parallel/tp_workers.py), none without --tp."""
    if config.tp == 1:
        return [], []
    if device != "cpu":
        raise ValueError("--tp across GPUs is not available yet (its all-reduce would be NCCL's); "
                         "tensor parallel runs on the CPU (--device cpu)")
    if config.cache_ram_bytes:
        raise ValueError("--cache-ram with --tp is not available yet (each rank would keep its own blocks)")
    log(f"tensor parallel over {config.tp} processes")
    return TensorParallelRunner.start_workers(config.tp, WorkerSpec(path, device, config.rope))


def load_or_exit(config: EngineConfig, announce: bool = False) -> tuple[ModelRunner, GGUFTokenizer, ParkPolicy]:
    """The model loaded, or the process ended with the reason on stderr. A refusal (the file or the options)
    ends it with START_REFUSED, and with `announce` (serving) an ERR line before READY tells the server why."""
    try:
        return build_runner(config)
    except (ModelLoadError, ModelNotFound, GGUFFormatError, ValueError) as e:
        log(f"error: {e}")
        if announce:
            print(encode(Err(str(e))), flush=True)
        sys.exit(START_REFUSED)
    except RuntimeError as e:
        log(f"error: {e}")
    except Exception as e:
        if not out_of_memory(e):
            raise
        log(f"error: out of memory while loading the model (try a smaller model or --ctx): {e}")
    sys.exit(1)


def serve(config: EngineConfig) -> int:
    runner, _, policy = load_or_exit(config, announce=True)
    gc.collect()
    gc.freeze()  # what start-up built lives as long as the process: the collector no longer walks it (a full
    # collection walked the vocabulary's lists, ~45 ms on an idle core, a stalled step)
    try:
        run_loop(runner, policy, config.prompt_reuse,
                 StepLimits(config.decode_interval_ms, config.step_tokens, config.step_ms,  # (Rounds: step_budget)
                            config.burst_ms))
    finally:
        runner.close()
    return 0


def chat(config: EngineConfig, args) -> int:
    from engine.terminal import chat_once

    prompt = args.prompt if args.prompt is not None else sys.stdin.read()
    if not prompt.strip():
        log("error: empty prompt (give one as an argument or on stdin)")
        return 2
    runner, tokenizer, _ = load_or_exit(config)
    try:
        return chat_once(runner, tokenizer, prompt, args)
    finally:
        runner.close()
