"""Everything the app holds while it runs, built in one place and started/stopped in lifespan."""
from __future__ import annotations

import asyncio
import time

from engine.modelfile.grammar_tokenizer import GrammarTokenizer
from serve.config import ServerSettings
from serve.engine_proc.engine_client import EngineClient, EngineState
from serve.scheduling.engine_router import EngineRouter
from serve.scheduling.metrics import Metrics
from serve.api.prompt_fit import PromptFit
from serve.api.response_store import ResponseStore
from serve.api.tokenize import LiteralTokenizer
from serve.scheduling.scheduler import Scheduler


class ServerState:
    def __init__(self, settings: ServerSettings, tokenizer, model_ctx: int, launched: list | None = None):
        """model_ctx: the context the default engine uses for this model without --ctx. launched:
        the engines already started (serve/engine_proc/engine_launch.py), one per engine, or None."""
        self.settings, self.tokenizer = settings, tokenizer
        self.grammar_tokenizer = GrammarTokenizer(tokenizer, tokenizer.vocab_size)  # built on first use
        self.literal_tokenizer = LiteralTokenizer(tokenizer)  # /tokenize's parse_special=false, built on first use
        self.prompt_fit = PromptFit.of(tokenizer)  # a text too long for the context, refused before tokenizing
        self.started_at = int(time.time())
        self.fallback_ctx = settings.ctx or model_ctx  # until the engine's READY says
        self.metrics = Metrics()
        self.responses = ResponseStore()  # stored Responses API turns, for previous_response_id
        self.event_streams = 0  # clients of /v1/events now (serve/http/events_api.py)
        schedulers = [Scheduler(self.metrics, settings.preempt.enabled, settings.preempt.max_wait_s,
                                settings.max_request_retries, frozenset({tokenizer.special.eos}),
                                settings.preempt.aged_s) for _ in range(settings.engines)]
        self.scheduler = EngineRouter(schedulers)  # the HTTP side's one queue (one scheduler per engine)
        self.metrics.watch_scheduler(self.scheduler)
        self.engines = []
        for i, scheduler in enumerate(schedulers):
            scheduler.engine = EngineClient(
                settings.engine_command(), settings.handshake_timeout_s, settings.max_restarts,
                on_message=scheduler.on_message, on_malformed=scheduler.on_malformed,
                on_exit=lambda reason, blame=True, i=i: self.scheduler.on_engine_exit(i, reason, blame),
                on_ready=scheduler.on_engine_ready, on_failed=lambda i=i: self.scheduler.on_engine_failed(i),
                env=settings.engine_env(i), launched=launched[i] if launched else None)
            self.engines.append(scheduler.engine)
        self.engine = self.engines[0]  # the first engine: the context, the model's info
        self._starters: list[asyncio.Task] = []

    @property
    def ctx(self) -> int:
        return self.engine.info.ctx or self.fallback_ctx

    @property
    def ready(self) -> bool:
        """Serving: every engine has started and at least one is ready now (one restarting
        leaves the others serving)."""
        return (all(e.state is not EngineState.STARTING for e in self.engines)
                and any(e.ready for e in self.engines))

    @property
    def health(self) -> str:
        return "ok" if self.ready else next((e.state.value for e in self.engines if not e.ready), "starting")

    @property
    def failure(self) -> str:
        """Why the engines that could not be started failed (their refusal or last error), else empty."""
        return "; ".join(e.failure for e in self.engines if e.state is EngineState.FAILED and e.failure)

    def start(self) -> None:
        """The engines start in the background: /health answers 503 until they are ready."""
        self.loop = asyncio.get_running_loop()
        self._starters = [asyncio.create_task(e.start()) for e in self.engines]

    def begin_shutdown(self) -> None:
        """First signal: no restarts from now on, no new work, the running requests may finish."""
        if self.engine.stopping:
            return
        for engine in self.engines:
            engine.stopping = True
        self.scheduler.shutdown()
        self.loop.call_later(self.settings.shutdown_grace_s, self.scheduler.stop_running)

    async def stop(self) -> None:
        self.begin_shutdown()  # already begun if a signal stopped the server
        deadline = time.monotonic() + self.settings.shutdown_grace_s
        while self.scheduler.running and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        self.scheduler.stop_running()
        for starter in self._starters:
            starter.cancel()
        await asyncio.gather(*(e.stop(self.settings.shutdown_timeout_s) for e in self.engines))
