"""`strata-server`: parse flags -> ServerSettings -> load the tokenizer -> uvicorn."""
from __future__ import annotations

import argparse
import logging
import sys

import uvicorn

from engine.model_path import ModelNotFound, resolve_model_path
from serve.config import PreemptSettings, ServerSettings, split_command


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="strata-server", description="OpenAI-compatible server for a local GGUF model")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8080)
    p.add_argument("--model", help="GGUF file (default: $STRATA_MODEL, else SmolLM2-135M-Instruct)")
    p.add_argument("--engine-cmd", help="the complete command of an engine speaking the protocol "
                                        "(default: strata --serve on --model)")
    p.add_argument("--api-key", help="require Authorization: Bearer <key> on /v1/*")
    p.add_argument("--ctx", type=int, help="context length (default: the model's, capped at 8192)")
    p.add_argument("--chunk", type=int, help="prompt tokens per prefill chunk (default engine only)")
    p.add_argument("--device", choices=("auto", "cpu", "gpu"), default="auto")
    p.add_argument("--keepalive-s", type=float, default=5.0, help="SSE comment interval while a stream waits")
    p.add_argument("--handshake-timeout-s", type=float, default=300.0, help="engine start-up limit")
    p.add_argument("--max-restarts", type=int, default=3, help="engine start attempts after a failure")
    p.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    g = p.add_argument_group("prefill preemption")
    g.add_argument("--prefill-preempt", action="store_true",
                   help="park a long prompt read at a chunk boundary while a short request runs")
    g.add_argument("--prefill-preempt-max-wait-s", type=float, default=30.0,
                   help="a parked request takes the next period after this long (0 = no limit)")
    g.add_argument("--prefill-preempt-min-tokens", type=int, help="forwarded to the default engine")
    g.add_argument("--prefill-preempt-max", type=int, help="forwarded to the default engine")
    g.add_argument("--prefill-preempt-snapshot-mib", type=int, help="forwarded to the default engine")
    return p


def settings_from_args(a: argparse.Namespace) -> ServerSettings:
    preempt = PreemptSettings(a.prefill_preempt, a.prefill_preempt_max_wait_s, a.prefill_preempt_min_tokens,
                              a.prefill_preempt_max, a.prefill_preempt_snapshot_mib)
    return ServerSettings(
        model_path=resolve_model_path(a.model), host=a.host, port=a.port,
        engine_cmd=split_command(a.engine_cmd) if a.engine_cmd is not None else (), api_key=a.api_key,
        ctx=a.ctx, chunk=a.chunk, device=a.device, preempt=preempt, keepalive_s=a.keepalive_s,
        handshake_timeout_s=a.handshake_timeout_s, max_restarts=a.max_restarts)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        settings = settings_from_args(args)
    except (ValueError, ModelNotFound) as e:
        print(f"strata-server: {e}", file=sys.stderr)
        return 2
    from engine.gguf_model import ModelLoadError
    from engine.tokenizer import load_tokenizer_and_ctx
    from serve.app import create_app

    try:
        tokenizer, model_ctx = load_tokenizer_and_ctx(str(settings.model_path))
    except ModelLoadError as e:
        print(f"strata-server: {e}", file=sys.stderr)
        return 2
    app = create_app(settings, tokenizer, model_ctx)
    config = uvicorn.Config(app, host=settings.host, port=settings.port, log_level=args.log_level,
                            timeout_graceful_shutdown=5)
    AnsweringServer(config).run()
    return 0


class AnsweringServer(uvicorn.Server):
    """uvicorn's Server, except that on SIGINT/SIGTERM every waiting request is answered (with an
    error) before uvicorn waits for open connections to finish: nothing hangs, nobody is dropped."""

    def handle_exit(self, sig, frame):
        state = getattr(self.config.app.state, "strata", None)
        if state is not None and self.started:
            state.loop.call_soon_threadsafe(state.scheduler.shutdown)
        super().handle_exit(sig, frame)
