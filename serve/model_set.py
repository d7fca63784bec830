"""The models one server answers for, by name (`--model NAME=PATH`, repeatable, and `--models-dir`):
each a ServerState of its own (tokenizer, queue, engine processes), so that two models run side by
side as two servers would, behind one port.

The first model is loaded at start, as a server of one model always was; `--preload` names others
to load at start. Those stay loaded. Any other model is loaded on its first request (the request
waits; /v1/models says which are loaded) and unloaded after `--idle-unload-s` with nothing queued,
running or parked. Before a load, what the model needs (its weights and its KV pool) is set against
the memory left where its engines run (the host's, or the GPUs' free memory), and the least recently
used idle model is unloaded to make room; a model that does
not fit even then is a 503 saying what is loaded and what it would need.

With one model a request's `model` field is not read (clients send names of their own: `gpt-4o`,
`claude-...`); with several, an unknown name is a 404 listing the names."""
from __future__ import annotations

import asyncio
import subprocess
import time
from dataclasses import dataclass, replace
from pathlib import Path

from engine.core.memory import available_memory
from serve.api.errors import APIError
from serve.config import ServerSettings
from serve.engine_proc.engine_client import EngineState
from serve.state import ServerState

GIB = 2**30


@dataclass
class ModelEntry:
    name: str
    path: Path
    kept: bool = False  # the first model and --preload's: loaded at start and never unloaded for idleness
    state: ServerState | None = None
    loading: asyncio.Future | None = None
    last_used: float = 0.0

    @property
    def loaded(self) -> bool:
        return self.state is not None and self.loading is None

    @property
    def busy(self) -> bool:
        s = self.state
        return s is not None and bool(s.scheduler.waiting or s.scheduler.running or s.scheduler.parked)


class ModelSet:
    def __init__(self, settings: ServerSettings, first: ServerState, build_state):
        """first: the first model's state (started by the app); build_state(settings) -> a ServerState
        for another model's settings (its tokenizer read from its file), run off the event loop."""
        self.settings, self.build_state = settings, build_state
        self.entries = {settings.model_name: ModelEntry(settings.model_name, settings.model_path, kept=True,
                                                        state=first, last_used=time.monotonic())}
        for name, path in settings.models:
            self.entries[name] = ModelEntry(name, path, kept=name in settings.preload)
        self.watcher: asyncio.Task | None = None

    @property
    def first(self) -> ServerState:
        return next(iter(self.entries.values())).state

    def start(self) -> None:
        """The preloaded models start loading now; idle ones are unloaded from here on."""
        for entry in self.entries.values():
            if entry.kept and entry.state is None:
                self._begin_load(entry)
        if self.settings.idle_unload_s > 0 and len(self.entries) > 1:
            self.watcher = asyncio.create_task(self._unload_idle())

    def entry(self, name: str | None) -> ModelEntry:
        """The model a request names: any name (or none) with one model, else one of the names."""
        if len(self.entries) == 1 or name is None:
            return next(iter(self.entries.values()))
        if name not in self.entries:
            raise APIError(404, f"the model {name!r} does not exist; this server has: {', '.join(self.entries)}",
                           param="model", code="model_not_found")
        return self.entries[name]

    async def state_for(self, name: str | None) -> ServerState:
        """The named model's state, loaded first if need be (the request waits for it)."""
        entry = self.entry(name)
        entry.last_used = time.monotonic()
        if entry.state is None or entry.loading is not None:
            if entry.loading is None:
                self._begin_load(entry)
            await asyncio.shield(entry.loading)
        entry.last_used = time.monotonic()
        return entry.state

    def watched_state(self, name: str) -> ServerState:
        """The named model's state for a live view (/v1/events?model=): never loads it, nor counts as a use."""
        entry = self.entry(name)
        if not entry.loaded:
            raise APIError(409, f"the model {entry.name!r} is not loaded (it loads on its first request)",
                           param="model", code="model_not_loaded")
        return entry.state

    def loaded_states(self) -> list[ServerState]:
        return [e.state for e in self.entries.values() if e.state is not None]

    def listing(self) -> list[dict]:
        """/v1/models' entries, the first model first, each saying whether it is loaded."""
        created = self.first.started_at
        return [{"id": e.name, "object": "model", "created": created, "owned_by": "strata", "loaded": e.loaded,
                 "status": "loaded" if e.loaded else "loading" if e.loading else "unloaded"}
                for e in self.entries.values()]

    # ------------------------------------------------------------ loading and unloading

    def _begin_load(self, entry: ModelEntry) -> None:
        entry.loading = asyncio.ensure_future(self._load(entry))

    async def _load(self, entry: ModelEntry) -> None:
        try:
            await self._make_room(entry)
            settings = replace(self.settings, model_path=entry.path, served_name=entry.name, models=(), preload=())
            entry.state = await asyncio.to_thread(self.build_state, settings)
            entry.state.start()
            await self._until_ready(entry)
        except BaseException:
            state, entry.state = entry.state, None
            if state is not None:
                await state.stop()
            raise
        finally:
            entry.loading = None

    async def _until_ready(self, entry: ModelEntry) -> None:
        state = entry.state
        while not state.ready:
            failed = [e for e in state.engines if e.state in (EngineState.FAILED, EngineState.STOPPED)]
            if failed:
                raise APIError(503, f"the model {entry.name!r} did not start: {failed[0].failure or 'its engine failed'}",
                               type_="server_error")
            await asyncio.sleep(0.05)

    async def _make_room(self, entry: ModelEntry) -> None:
        """Unload idle models, least recently used first, until the new one fits the memory left where its engines
        run (the host's, or the GPUs'); a 503 if it cannot."""
        need = await asyncio.to_thread(self.settings.memory_need, entry.path)  # (reads the file's header: off the loop)
        gpu = self.settings.on_gpu
        where = "of GPU memory (its weights and the least KV pool)" if gpu else "(its weights and KV pool)"
        while need > (left := await asyncio.to_thread(gpu_free_memory, self.settings.gpus) if gpu
                      else available_memory()):
            idle = sorted((e for e in self.entries.values() if e.loaded and not e.kept and not e.busy),
                          key=lambda e: e.last_used)
            if not idle:
                loaded = ", ".join(f"{e.name} ({'kept' if e.kept else 'busy' if e.busy else 'idle'})"
                                   for e in self.entries.values() if e.loaded) or "none"
                hint = "; a GPU engine takes the card's free memory unless --gpu-memory caps it" if gpu else ""
                raise APIError(503, f"the model {entry.name!r} needs about {need / GIB:.1f} GiB {where} and "
                                    f"{left / GIB:.1f} GiB is left; loaded: {loaded}{hint}", type_="server_error")
            await self.unload(idle[0])

    async def unload(self, entry: ModelEntry) -> None:
        state, entry.state = entry.state, None
        if state is not None:
            print(f"strata-server: unloading the model {entry.name!r}", flush=True)
            await state.stop()

    async def _unload_idle(self) -> None:
        every = min(1.0, self.settings.idle_unload_s / 4)
        while True:
            await asyncio.sleep(every)
            now = time.monotonic()
            for entry in list(self.entries.values()):
                if entry.busy:  # its quiet is counted from its last work, not from its last request's start
                    entry.last_used = now
                elif entry.loaded and not entry.kept and now - entry.last_used >= self.settings.idle_unload_s:
                    await self.unload(entry)

    async def stop(self) -> None:
        """Every model's engines stopped (the first model's by the app, which started it)."""
        if self.watcher is not None:
            self.watcher.cancel()
        for entry in list(self.entries.values())[1:]:
            if entry.loading is not None:
                entry.loading.cancel()
                await asyncio.gather(entry.loading, return_exceptions=True)
            await self.unload(entry)


def gpu_free_memory(gpus: tuple[str, ...] | None) -> int:
    """The least free memory of the GPUs the engines use (--gpus, else the first), as NVIDIA's driver reports it
    (nvidia-smi: the server imports no CUDA library); very large if it cannot say."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.free", "--format=csv,noheader,nounits",
                              "-i", ",".join(gpus or ("0",))], capture_output=True, text=True, timeout=10, check=True)
        return min(int(line) for line in out.stdout.split()) * 2**20
    except (OSError, subprocess.SubprocessError, ValueError):
        return 2**62
