"""Everything the app holds while it runs, built in one place and started/stopped in lifespan."""
from __future__ import annotations

import asyncio
import time

from engine.grammar import GrammarTokenizer
from serve.config import ServerSettings
from serve.engine_client import EngineClient
from serve.metrics import Metrics
from serve.response_store import ResponseStore
from serve.scheduler import Scheduler


class ServerState:
    def __init__(self, settings: ServerSettings, tokenizer, model_ctx: int):
        """model_ctx: the context the default engine uses for this model without --ctx."""
        self.settings, self.tokenizer = settings, tokenizer
        self.grammar_tokenizer = GrammarTokenizer(tokenizer, tokenizer.vocab_size)  # built on first use
        self.started_at = int(time.time())
        self.fallback_ctx = settings.ctx or model_ctx  # until the engine's READY says
        self.metrics = Metrics()
        self.responses = ResponseStore()  # stored Responses API turns, for previous_response_id
        self.scheduler = Scheduler(self.metrics, settings.preempt.enabled, settings.preempt.max_wait_s,
                                   settings.max_request_retries, frozenset({tokenizer.special.eos}),
                                   settings.preempt.aged_s)
        self.engine = EngineClient(
            settings.engine_command(), settings.handshake_timeout_s, settings.max_restarts,
            on_message=self.scheduler.on_message, on_malformed=self.scheduler.on_malformed,
            on_exit=self.scheduler.on_engine_exit, on_ready=self.scheduler.on_engine_ready,
            on_failed=self.scheduler.on_engine_failed)
        self.scheduler.engine = self.engine
        self._starter: asyncio.Task | None = None

    @property
    def ctx(self) -> int:
        return self.engine.info.ctx or self.fallback_ctx

    def start(self) -> None:
        """The engine starts in the background: /health answers 503 until it is ready."""
        self.loop = asyncio.get_running_loop()
        self._starter = asyncio.create_task(self.engine.start())

    def begin_shutdown(self) -> None:
        """First signal: no restarts from now on, no new work, the running requests may finish."""
        if self.engine.stopping:
            return
        self.engine.stopping = True
        self.scheduler.shutdown()
        self.loop.call_later(self.settings.shutdown_grace_s, self.scheduler.stop_running)

    async def stop(self) -> None:
        self.begin_shutdown()  # already begun if a signal stopped the server
        deadline = time.monotonic() + self.settings.shutdown_grace_s
        while self.scheduler.running and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        self.scheduler.stop_running()
        if self._starter:
            self._starter.cancel()
        await self.engine.stop(self.settings.shutdown_timeout_s)
