"""One request's state, end to end: the scheduler, the engine client and the HTTP layer share it."""
from __future__ import annotations

import asyncio
import itertools
import time
from contextvars import ContextVar
from dataclasses import dataclass, field
from enum import Enum

from protocol import messages as m

_ids = itertools.count(1)
# when the HTTP request being served reached the server (serve/http/received.py sets it): the requests made while
# serving it count their waits from it
ARRIVAL: ContextVar[float | None] = ContextVar("strata_arrival", default=None)


class Phase(str, Enum):
    QUEUED = "queued"
    RUNNING = "running"  # in the engine: reading its prompt or decoding
    PARKED = "parked"  # its read is suspended at a chunk boundary inside the engine
    DONE = "done"


@dataclass(frozen=True)
class EngineFailure:
    """Delivered instead of an engine line when the request cannot continue."""

    message: str
    status: int = 503


@dataclass(eq=False)  # a request is itself: `in` and `remove` over the queues compare identities (by value they
# walked the prompts, whose first thousands of tokens sub-agents share)
class Request:
    prompt: list[int]
    max_tokens: int
    sampling: dict  # GEN keys (protocol.messages.GEN_KEYS)
    stop: tuple[str, ...] = ()
    stream: bool = False
    priority: int = 0  # lower runs first (as vLLM's); a lower class never preempts a higher one
    id: int = field(default_factory=lambda: next(_ids))
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    phase: Phase = Phase.QUEUED
    made: float = field(default_factory=time.monotonic)  # (its prompt read, templated and tokenized by then)
    arrived: float | None = None  # its HTTP request's arrival (ARRIVAL), else when it was made
    first_chunk_at: float | None = None
    first_token_at: float | None = None
    first_text_at: float | None = None  # when its first text was handed to the response (a token may hold none)
    first_text_token: int = 0  # which of its tokens (1 = the first) completed that text
    prompt_done: int = 0  # progress of the current read (a re-read after an engine death starts at 0)
    prompt_counted: int = 0  # prompt tokens counted in the metrics: each once, whatever re-reads
    output: list[int] = field(default_factory=list)  # every token the engine sent, across restarts
    parks: int = 0
    parked_at: float | None = None
    first_parked_at: float | None = None  # its postponement is bounded from here (max_wait_s)
    lined_at: float = 0.0  # when it last went into the engine (GEN or RESUME): its age behind the front read
    in_host: bool = False  # the engine moved its rows to host memory (a parked read, or paused for memory)
    paused: bool = False  # paused by the engine for memory (INFO paused=1): it comes back first
    resuming: bool = False  # its latest grant was a RESUME (a DEFER puts it back among the parked)
    cached: int = 0  # prompt tokens the prefix cache saved it from reading
    parked_s: float = 0.0
    protected: bool = False  # resumed by the max-wait rule: no more boundary offers
    yielded_to: set[int] = field(default_factory=set)  # while parked: the requests it made way for (ids)
    abandoned: bool = False  # its client left (or a stop string matched); the engine may still hold it
    restarts: int = 0  # engine restarts this request lived through
    deaths_running: int = 0  # engine deaths while it was the request being run (a poison count)
    engine: int = 0  # which engine runs it (serve/scheduling/engine_router.py)
    predict_limit_s: float | None = None  # llama-server's t_max_predict_ms: the answer ends at its first new
    # line written once this long past its first token (an editor's completion: a few whole lines)

    def __post_init__(self):
        if self.arrived is None:
            self.arrived = ARRIVAL.get() or self.made

    @property
    def generated(self) -> int:
        return len(self.output)

    def gen(self) -> m.Gen:
        """The GEN that (re)starts this request. After an engine death, a request that has
        tokens continues from its prompt plus those tokens: the penalty window is rebuilt from
        them, and `drawn` makes the seeded stream skip the draws already made."""
        params = self.sampling | ({"drawn": self.generated} if self.output else {})
        return m.Gen(self.max_tokens - self.generated, tuple(self.prompt) + tuple(self.output), params, self.id)

    def requeue(self) -> None:
        """Back to the queue after an engine death; what the client has received stays."""
        self.phase, self.prompt_done, self.protected, self.cached = Phase.QUEUED, 0, False, 0
        self.in_host = self.paused = self.resuming = False
        self.yielded_to = set()

    @property
    def reading(self) -> bool:
        return self.phase is Phase.RUNNING and self.generated == 0

    @property
    def left_to_read(self) -> int:
        """Prompt tokens its read still has ahead (all of them before it starts)."""
        return len(self.prompt) + len(self.output) - self.prompt_done

    @property
    def queue_wait_s(self) -> float | None:
        return None if self.first_chunk_at is None else self.first_chunk_at - self.arrived

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token_at is None else self.first_token_at - self.arrived

    def deliver(self, event) -> None:
        self.events.put_nowait(event)
