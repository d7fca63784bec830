"""`strata-server`: parse flags -> ServerSettings -> load the tokenizer -> uvicorn."""
from __future__ import annotations

import argparse
import contextlib
import gc
import logging
import signal
import sys
from dataclasses import replace
from pathlib import Path

import uvicorn

from engine.modelfile.rope_config import add_rope_args, rope_from_args
from engine.config import DEFAULT_BURST_MS, DEFAULT_DECODE_INTERVAL_MS, SPECULATIVE, WEIGHT_FORMS
from engine.core.kv_types import KV_TYPES
from engine.kvcache.prompt_weights import MODES
from engine.modelfile.model_path import ModelNotFound, resolve_model_path
from serve.config import REASONING_FORMATS, PreemptSettings, ServerSettings, split_command


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="strata-server", description="OpenAI-compatible server for a local GGUF model")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8080)
    p.add_argument("--model", action="append", metavar="[NAME=]PATH",
                   help="GGUF file (default: $STRATA_MODEL, else SmolLM2-135M-Instruct); repeatable as NAME=PATH to "
                        "serve several models, a request's `model` picking one (the first is loaded at start)")
    p.add_argument("--models-dir", metavar="DIR", help="serve every .gguf file in DIR too, each by its file's stem")
    p.add_argument("--preload", action="append", metavar="NAME[,NAME...]",
                   help="models to load at start, besides the first, and keep loaded")
    p.add_argument("--idle-unload-s", type=float, default=300.0,
                   help="a model loaded on demand is unloaded after this long with no request (default 300; 0: "
                        "never)")
    p.add_argument("--engine-cmd", help="the complete command of an engine speaking the protocol "
                                        "(default: strata --serve on --model)")
    p.add_argument("--allowed-hosts", metavar="NAME[,NAME...]",
                   help="Host names to answer besides loopback's (a reverse proxy's name); bound to a loopback "
                        "address (the default) any other Host gets 403, against DNS rebinding; bound elsewhere "
                        "the check applies only when this is given")
    p.add_argument("--cors-origin", action="append", metavar="ORIGIN[,ORIGIN...]",
                   help="let pages of this origin (e.g. http://localhost:3000; * for any) call the server from a "
                        "browser; other origins' requests get 403 (repeatable)")
    p.add_argument("--api-key", help="require Authorization: Bearer <key> on /v1/*")
    p.add_argument("--ctx", type=int, help="context length (default: the model's, capped at 8192)")
    p.add_argument("--chunk", type=int, help="prompt tokens per prefill chunk (default engine only)")
    p.add_argument("--device", choices=("auto", "cpu", "gpu"), default="auto")
    p.add_argument("--weights", choices=WEIGHT_FORMS,
                   help="GPU: keep quantized weights in their blocks (default) or expand them to fp16 at load")
    p.add_argument("--prompt-weights", choices=MODES,
                   help="GPU: a prompt step's quantized matrices expanded once and kept (resident) or each step "
                        "(per-step); default auto: resident where the card has the room (forwarded)")
    p.add_argument("--keepalive-s", type=float, default=5.0, help="SSE comment interval while a stream waits")
    p.add_argument("--handshake-timeout-s", type=float, default=300.0, help="engine start-up limit")
    p.add_argument("--max-restarts", type=int, default=3, help="engine start attempts after a failure")
    p.add_argument("--max-queue", type=int, default=1024,
                   help="requests waiting for the engine beyond which a new one is refused at once: 429 with "
                        "Retry-After (OpenAI paths), 529 overloaded_error (Anthropic's); 0: no limit")
    p.add_argument("--max-body-mb", type=float, metavar="MIB",
                   help="request bodies larger than this are refused with 413 before they are read whole "
                        "(default: 16 bytes a context token, at least 4 MiB; 0: no limit)")
    p.add_argument("--max-request-retries", type=int, default=2,
                   help="a request running at this many engine deaths is taken for their cause and fails")
    p.add_argument("--shutdown-grace-s", type=float, default=5.0,
                   help="on SIGINT/SIGTERM, how long the running request may take to finish")
    p.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    p.add_argument("--reasoning-format", choices=REASONING_FORMATS, default="deepseek",
                   help="a thinking model's <think>...</think> text (Qwen3, QwQ, DeepSeek-R1): deepseek = returned "
                        "as reasoning_content beside content (as llama.cpp's option of that name), none = left inline")
    for flag, kind, what in (("--temp", float, "temperature"), ("--top-k", int, "top_k"), ("--top-p", float, "top_p"),
                             ("--min-p", float, "min_p")):
        p.add_argument(flag, type=kind, dest=f"default_{what}",
                       help=f"the {what} of a request that gives none (default: the model's, from its GGUF, else "
                            "llama.cpp's: temperature 0.8, top_k 40, top_p 0.95, min_p 0.05)")
    p.add_argument("--engines", type=int, default=None,
                   help="engine processes behind the one queue, each with its own KV pool; a request goes to "
                        "the engine whose prefix cache holds most of its prompt, else the least loaded (default 1; "
                        "on a machine without GPUs, N NumPy engines)")
    p.add_argument("--gpus", metavar="ID[,ID...]", help="one engine per GPU (CUDA_VISIBLE_DEVICES of each): "
                                                         "--gpus 0,1 runs two")
    p.add_argument("--tp", type=int, metavar="N", help="tensor parallel over N processes under each engine "
                                                        "(forwarded; the CPU for now, see the engine's --tp)")
    p.add_argument("--max-running", "--slots", dest="max_running", type=int,
                   help="requests in the engine at once, decoded as one batch; KV memory is the real limit "
                        "(forwarded to the default engine; default: the engine's, 256; --slots is the old name)")
    p.add_argument("--kv-tokens", type=int, help="the KV pool shared by all requests, in tokens (forwarded; default: "
                                                 "on the GPU what the weights leave, on the CPU 4 contexts)")
    p.add_argument("--kv-block", type=int, help="positions per KV block (forwarded; default 64)")
    p.add_argument("--kv-type", choices=KV_TYPES, help="the KV cache's element type (forwarded; default auto: float32 on "
                                                       "the CPU, float16 on the GPU; q8_0: 8-bit, on either)")
    p.add_argument("--prompt-reuse", action=argparse.BooleanOptionalAction, default=True,
                   help="the prefix cache: a prompt that starts as an earlier or running request's reads only "
                        "the rest (forwarded to the default engine; default: on)")
    p.add_argument("--cache-ram", dest="cache_ram_gib", type=float, metavar="GIB",
                   help="host memory for prefix-cache blocks evicted from the KV pool, copied back instead of read "
                        "again (forwarded; default: on the GPU 8 GiB, on the CPU 0)")
    p.add_argument("--gpu-memory", dest="gpu_memory_gib", type=float, metavar="GIB",
                   help="the most GPU memory each engine takes, weights included (forwarded; default: all the card "
                        "has free)")
    p.add_argument("--expert-slots", type=int, metavar="N",
                   help="a mixture of experts' routed experts in host memory behind N device slots a layer (forwarded; "
                        "default: all on the GPU when the model fits, else as many slots as --gpu-memory leaves)")
    p.add_argument("--decode-interval-ms", type=float,
                   help="while a long prompt is read, decoding requests get a step about this often (forwarded to "
                        f"the default engine; default: the engine's, {DEFAULT_DECODE_INTERVAL_MS:g})")
    p.add_argument("--burst-ms", type=float,
                   help="while short prompts wait, decoding requests' next token may wait up to this long for their "
                        f"first tokens (forwarded to the default engine; default: the engine's, {DEFAULT_BURST_MS:g}; "
                        "0: the decode interval always)")
    p.add_argument("--step-tokens", type=int,
                   help="prompt tokens one engine step may read from several requests at once (forwarded to the "
                        "default engine; default: the engine's, two chunks)")
    p.add_argument("--step-ms", type=float,
                   help="while other requests decode, a prompt step takes no more rows than its estimated time "
                        "allows, so that a newcomer's wait for the step in progress is short (forwarded to the "
                        "default engine; default: the engine's)")
    p.add_argument("--speculative", choices=SPECULATIVE,
                   help="speculative decoding: ngram drafts from the request's own context, draft has a smaller "
                        "model of the same vocabulary (--draft) propose; checked in the request's decode step, the "
                        "text unchanged (forwarded to the default engine; default: off)")
    p.add_argument("--draft-max", type=int, help="the most tokens a draft proposes (forwarded; default: 8)")
    p.add_argument("--draft-row-cost", type=float,
                   help="a drafted row's cost against a request's share of a decode step (forwarded; default: "
                        "measured)")
    p.add_argument("--draft", metavar="FILE", help="--speculative draft: the draft model's GGUF, of the model's "
                                                   "vocabulary (forwarded; one model served)")
    p.add_argument("--pooling", choices=("mean", "cls", "last"),
                   help="/v1/embeddings: how the model's hidden states are pooled (forwarded to the default engine; "
                        "default: as the model's file says; a chat model's file says nothing, so its embeddings "
                        "need this flag)")
    g = p.add_argument_group("prefill preemption")
    g.add_argument("--prefill-preempt", action=argparse.BooleanOptionalAction, default=True,
                   help="park a long prompt read at a chunk boundary while a short request runs "
                        "(default: on; --no-prefill-preempt serves strict FIFO)")
    g.add_argument("--prefill-preempt-max-wait-s", type=float, default=30.0,
                   help="a parked request takes the next period after this long (0 = no limit)")
    g.add_argument("--prefill-preempt-aged-s", type=float, default=4.0,
                   help="a waiter parks the read once it is this old, even if its own read is not shorter "
                        "than what the reader has left")
    g.add_argument("--prefill-preempt-min-tokens", type=int, help="forwarded to the default engine")
    g.add_argument("--prefill-preempt-max", type=int, help="forwarded to the default engine")
    g.add_argument("--prefill-preempt-snapshot-mib", type=int, help="forwarded to the default engine")
    add_rope_args(p)  # forwarded to the default engine
    return p


def settings_from_args(a: argparse.Namespace) -> ServerSettings:
    preempt = PreemptSettings(a.prefill_preempt, a.prefill_preempt_max_wait_s, a.prefill_preempt_aged_s,
                              a.prefill_preempt_min_tokens, a.prefill_preempt_max, a.prefill_preempt_snapshot_mib)
    (first_name, first_path), *others = named_models(a.model or [], a.models_dir)
    return ServerSettings(
        model_path=first_path, served_name=first_name, models=tuple(others),
        preload=tuple(n.strip() for value in a.preload or () for n in value.split(",") if n.strip()),
        idle_unload_s=a.idle_unload_s, host=a.host, port=a.port,
        engine_cmd=split_command(a.engine_cmd) if a.engine_cmd is not None else (), api_key=a.api_key,
        ctx=a.ctx, chunk=a.chunk, device=a.device, weights=a.weights, prompt_weights=a.prompt_weights,
        preempt=preempt, keepalive_s=a.keepalive_s,
        handshake_timeout_s=a.handshake_timeout_s, max_restarts=a.max_restarts, max_queue=a.max_queue,
        max_body_mb=a.max_body_mb, max_request_retries=a.max_request_retries,
        shutdown_grace_s=a.shutdown_grace_s,
        reasoning_format=a.reasoning_format, max_running=a.max_running, kv_tokens=a.kv_tokens,
        kv_block=a.kv_block, kv_type=a.kv_type, tp=a.tp, prompt_reuse=a.prompt_reuse, cache_ram_gib=a.cache_ram_gib,
        gpu_memory_gib=a.gpu_memory_gib, expert_slots=a.expert_slots,
        decode_interval_ms=a.decode_interval_ms, burst_ms=a.burst_ms, step_tokens=a.step_tokens, step_ms=a.step_ms,
        speculative=a.speculative, draft_max=a.draft_max, draft_row_cost=a.draft_row_cost, draft=resolve_model_path(a.draft) if a.draft else None,
        pooling=a.pooling, allowed_hosts=host_list(a.allowed_hosts),
        cors_origins=origin_list(a.cors_origin), rope=rope_from_args(a),
        **engines_from_args(a))


def named_models(values: list[str], directory: str | None) -> list[tuple[str | None, Path]]:
    """(name, file) of every model: --model's in order (a bare path is named by the server as its stem:
    None), then the .gguf files of --models-dir not already given; the default model when none is."""
    out: list[tuple[str | None, Path]] = []
    for value in values:
        name, sep, path = value.partition("=")
        if sep and ("/" in name or not name):  # a path holding '=': a bare path after all
            name, sep, path = "", "", value
        out.append((name if sep else None, resolve_model_path(path if sep else value)))
    if directory is not None:
        folder = Path(directory).expanduser()
        if not folder.is_dir():
            raise ValueError(f"--models-dir {folder} is not a directory")
        given = {path.resolve() for _, path in out}
        out += [(None, path) for path in sorted(folder.glob("*.gguf")) if path.resolve() not in given]
    if not out:
        out.append((None, resolve_model_path(None)))
    return [(name if i == 0 else name or path.stem, path) for i, (name, path) in enumerate(out)]


def engines_from_args(a: argparse.Namespace) -> dict:
    gpus = None if a.gpus is None else tuple(g.strip() for g in a.gpus.split(",") if g.strip())
    if gpus is not None and not gpus:
        raise ValueError("--gpus is empty")
    return {"engines": a.engines if a.engines is not None else len(gpus) if gpus else 1, "gpus": gpus}


def host_list(text: str | None) -> tuple[str, ...] | None:
    if text is None:
        return None
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    if not names:
        raise ValueError("--allowed-hosts is empty")
    return names


def origin_list(values: list[str] | None) -> tuple[str, ...]:
    origins = tuple(o.strip() for value in values or () for o in value.split(",") if o.strip())
    if values and not origins:
        raise ValueError("--cors-origin is empty")
    for origin in origins:
        if origin not in ("*", "null") and "://" not in origin:
            raise ValueError(f"--cors-origin {origin!r} is not an origin: write scheme://host[:port], e.g. "
                             "http://localhost:3000")
    return origins


def main(argv: list[str] | None = None) -> int:
    try:
        return run(argv)
    except KeyboardInterrupt:  # Ctrl+C before the server took over the signals (loading)
        return 130


def run(argv: list[str] | None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        settings = settings_from_args(args)
    except (ValueError, ModelNotFound) as e:
        print(f"strata-server: {e}", file=sys.stderr)
        return 2
    from serve.engine_proc.engine_launch import abandon, launch

    # the engines load their model while this process imports the app and reads the tokenizer
    launched = [launch(settings.engine_command(), settings.engine_env(i)) for i in range(settings.engines)]
    try:
        return serve_app(args, settings, launched)
    finally:
        abandon(launched)  # those still running once the server is done (its shutdown has QUIT the adopted)


def serve_app(args: argparse.Namespace, settings: ServerSettings, launched: list) -> int:
    from engine.modelfile.gguf_file import GGUFFile
    from engine.modelfile.model_config import ModelLoadError, read_config
    from engine.modelfile.tokenizer import GGUFTokenizer
    from serve.app import create_app
    from serve.api.sampling_defaults import sampling_defaults
    from serve.state import ServerState

    def model_parts(settings: ServerSettings):
        """The model's settings (its sampling defaults), tokenizer and default context, from its file."""
        reader = GGUFFile(str(settings.model_path), "r")  # read once: the vocabulary is ~100K strings
        tokenizer, model_ctx = GGUFTokenizer(reader), read_config(reader).default_ctx
        return replace(settings, sampling=sampling_defaults(reader, {
            k: getattr(args, f"default_{k}") for k in ("temperature", "top_k", "top_p", "min_p")})), tokenizer, model_ctx

    try:
        settings, tokenizer, model_ctx = model_parts(settings)
    except (ModelLoadError, ValueError) as e:
        print(f"strata-server: {e}", file=sys.stderr)
        return 2
    app = create_app(settings, tokenizer, model_ctx, launched, build_state=lambda s: ServerState(*model_parts(s)))
    gc.collect()
    gc.freeze()  # what start-up built lives as long as the server: a full collection no longer walks it (it took
    # ~45 ms on an idle core, over 100 ms on a busy one, with the event loop stopped)
    config = uvicorn.Config(app, host=settings.host, port=settings.port, log_level=args.log_level,
                            timeout_graceful_shutdown=settings.shutdown_grace_s + 3)
    AnsweringServer(config).run()
    return 0


class AnsweringServer(uvicorn.Server):
    """uvicorn's Server, owning shutdown. On SIGINT or SIGTERM: no new work and no engine restart,
    the waiting and parked requests are answered at once, the running one may finish within
    --shutdown-grace-s (a second signal ends it now), then the engine gets QUIT. The process then
    exits with status 0: uvicorn would re-raise the signal, a traceback for SIGINT."""

    def handle_exit(self, sig, frame):
        models = getattr(self.config.app.state, "models", None)
        for state in models.loaded_states() if models is not None else ():
            if hasattr(state, "loop"):
                stopping = state.engine.stopping
                state.loop.call_soon_threadsafe(state.scheduler.stop_running if stopping else state.begin_shutdown)
        super().handle_exit(sig, frame)

    @contextlib.contextmanager
    def capture_signals(self):
        handlers = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in handlers.items():
                signal.signal(sig, handler)
