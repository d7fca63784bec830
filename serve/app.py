"""create_app: wiring only. The engine starts in lifespan and is stopped there."""
from __future__ import annotations

from contextlib import asynccontextmanager

from fastapi import FastAPI

from engine import __version__
from serve.http.body_limit import BodyLimit, body_limit_bytes
from serve.config import ServerSettings
from serve.http.error_handlers import install_error_handlers
from serve.http.host_check import HostCheck, allowed_host_names
from serve.http.origin_check import OriginCheck
from serve.http.received import Received
from serve.http.web_page import include_page
from serve.http.routes import include_routes
from serve.loop_stalls import start_stall_watch
from serve.model_set import ModelSet
from serve.state import ServerState


def create_app(settings: ServerSettings, tokenizer, model_ctx: int, launched: list | None = None,
               build_state=None) -> FastAPI:
    """launched: engines already started for this app (serve/engine_proc/engine_launch.py), adopted at its start;
    build_state(settings) -> the ServerState of another model (serve/model_set.py), when the server has several."""
    @asynccontextmanager
    async def lifespan(app: FastAPI):
        state = app.state.strata = ServerState(settings, tokenizer, model_ctx, launched)
        models = app.state.models = ModelSet(settings, state, build_state)
        state.start()
        models.start()
        stalls = start_stall_watch()  # ($STRATA_STALL_MS: where the event loop stalls, to stderr)
        try:
            yield
        finally:
            if stalls is not None:
                stalls.stop()
            await models.stop()
            await state.stop()

    app = FastAPI(title="Strata", version=__version__, lifespan=lifespan)
    install_error_handlers(app)
    # the last added runs first: the arrival's stamp, the Host check, the origin check, the body limit, the routes
    app.add_middleware(BodyLimit, limit_bytes=body_limit_bytes(settings.max_body_mb, settings.ctx or model_ctx))
    app.add_middleware(OriginCheck, origins=settings.cors_origins)
    app.add_middleware(HostCheck, allowed=allowed_host_names(settings.host, settings.allowed_hosts))
    app.add_middleware(Received)
    include_routes(app)
    include_page(app)
    return app
