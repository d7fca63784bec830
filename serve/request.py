"""One request's state, end to end: the scheduler, the engine client and the HTTP layer share it."""
from __future__ import annotations

import asyncio
import itertools
import time
from dataclasses import dataclass, field
from enum import Enum

_ids = itertools.count(1)


class Phase(str, Enum):
    QUEUED = "queued"
    RUNNING = "running"  # owns the engine: reading its prompt or decoding
    PARKED = "parked"  # its read is suspended at a chunk boundary inside the engine
    DONE = "done"


@dataclass(frozen=True)
class EngineFailure:
    """Delivered instead of an engine line when the request cannot continue."""

    message: str
    status: int = 503


@dataclass
class Request:
    prompt: list[int]
    max_tokens: int
    sampling: dict  # GEN keys (protocol.messages.GEN_KEYS)
    stop: tuple[str, ...] = ()
    stream: bool = False
    id: int = field(default_factory=lambda: next(_ids))
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    phase: Phase = Phase.QUEUED
    arrived: float = field(default_factory=time.monotonic)
    first_chunk_at: float | None = None
    first_token_at: float | None = None
    prompt_done: int = 0
    generated: int = 0
    parks: int = 0
    parked_at: float | None = None
    parked_s: float = 0.0
    protected: bool = False  # resumed by the max-wait rule: no more boundary offers
    abandoned: bool = False  # its client left (or a stop string matched); the engine may still hold it

    @property
    def reading(self) -> bool:
        return self.phase is Phase.RUNNING and self.generated == 0

    @property
    def queue_wait_s(self) -> float | None:
        return None if self.first_chunk_at is None else self.first_chunk_at - self.arrived

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token_at is None else self.first_token_at - self.arrived

    def deliver(self, event) -> None:
        self.events.put_nowait(event)
