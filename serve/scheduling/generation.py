"""Turn a request's engine events into text pieces: detokenization, stop strings, keep-alives; or, for an
embed request, into its vector."""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import AsyncIterator

from protocol import messages as m

from serve.scheduling.metrics import Metrics
from serve.scheduling.request import EngineFailure, Phase, Request
from serve.scheduling.scheduler import Scheduler
from serve.api.stop_strings import StopMatcher

FINISH = {"stop": "stop", "length": "length", "cancel": "stop"}


class GenerationError(RuntimeError):
    def __init__(self, message: str, status: int = 503):
        super().__init__(message)
        self.status = status


@dataclass
class KeepAlive:
    """Nothing to say yet (queued or parked): a streaming response sends an SSE comment."""


@dataclass
class Piece:
    text: str
    logprobs: list[m.Token] = field(default_factory=list)  # the tokens since the last piece, with logprobs asked
    prompt_logprobs: list[m.Token] = field(default_factory=list)  # on the first piece: the prompt's (PLP lines)


@dataclass
class Finished:
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    timings: dict
    stop_sequence: str | None = None  # the stop string that ended the output, if one did
    cached_tokens: int = 0  # prompt tokens the prefix cache saved the engine from reading
    logprobs: list[m.Token] = field(default_factory=list)  # every answer token's, with logprobs asked
    prompt_logprobs: list[m.Token] = field(default_factory=list)  # the prompt's tokens', the first without one


class Outcome:
    """How a request's run ends, as the metrics count it: an end the engine gave (`finished`), an
    error (GenerationError), or, its client gone, a cancellation, which frees the engine of it."""

    def __init__(self, req: Request, scheduler: Scheduler, metrics: Metrics):
        self.req, self.scheduler, self.metrics, self.finished = req, scheduler, metrics, False

    def __enter__(self) -> "Outcome":
        return self

    def __exit__(self, kind, error, trace) -> bool:
        if kind is not None and issubclass(kind, GenerationError):
            self.finished = True
            self.metrics.requests.labels("error").inc()
        if not self.finished:  # client gone (cancelled or closed): free the engine
            self.metrics.requests.labels("cancelled").inc()
            if self.req.phase is not Phase.DONE:
                self.scheduler.abandon(self.req)
        return False


def failure(event) -> GenerationError | None:
    """The error an engine line or an engine failure ends a request with, if it is one."""
    if isinstance(event, m.Err):
        return GenerationError(f"engine error: {event.message}", status=400)
    if isinstance(event, EngineFailure):
        return GenerationError(event.message, event.status)
    return None


async def generate(req: Request, scheduler: Scheduler, tokenizer, metrics: Metrics,
                   keepalive_s: float) -> AsyncIterator[KeepAlive | Piece | Finished]:
    detok, stops = tokenizer.stream(), StopMatcher(req.stop)
    scored, pending = [], []  # tokens with logprobs: all of them, and those not yet in a piece
    prompt_lines: dict[int, m.PromptLogprobs] = {}  # PLP lines by start (a read again after a restart: the last)
    prompt_given: list[m.Token] | None = None  # the prompt's log-probabilities, built once (the first piece's)
    tokens = 0  # the answer's tokens taken so far
    metrics.intake.observe(req.made - req.arrived)
    scheduler.submit(req)
    with Outcome(req, scheduler, metrics) as outcome:
        while True:
            if not req.events.empty():  # (a timeout armed per token was a tenth of a streamed token's cost)
                event = req.events.get_nowait()
            else:
                try:  # asyncio.timeout, not wait_for: 3.11's wait_for can swallow a cancellation
                    async with asyncio.timeout(keepalive_s):  # that races with a token's arrival
                        event = await req.events.get()
                except TimeoutError:
                    yield KeepAlive()
                    continue
            if isinstance(event, m.PromptLogprobs):
                prompt_lines[event.start] = event
            elif isinstance(event, m.Token):
                tokens += 1
                if event.logprob is not None and event.token not in tokenizer.end_ids:  # (the end is no text)
                    scored.append(event)
                    pending.append(event)
                text = stops.feed(detok.step(event.token))
                if text:
                    first = prompt_given is None
                    if req.first_text_at is None:
                        req.first_text_at, req.first_text_token = time.monotonic(), tokens
                    prompt_given = prompt_scores(req, prompt_lines) if first else prompt_given
                    yield Piece(text, pending, prompt_given if first else [])
                    pending = []
                if stops.hit or ("\n" in text and past_limit(req)):  # (llama-server: only at a new line)
                    scheduler.abandon(req)  # STOP the engine; we have what we need
                    outcome.finished = True
                    yield _finish(req, "stop" if stops.hit else "length", metrics, stop_sequence=stops.matched,
                                  logprobs=scored, prompt_logprobs=prompt_given or prompt_scores(req, prompt_lines))
                    return
            elif isinstance(event, m.Done):
                outcome.finished = True
                rest = stops.flush()
                if rest or pending:
                    yield Piece(rest, pending)
                yield _finish(req, FINISH[event.finish], metrics, event, logprobs=scored,
                              prompt_logprobs=prompt_given or prompt_scores(req, prompt_lines))
                return
            elif (error := failure(event)) is not None:
                raise error


def past_limit(req: Request) -> bool:
    """Whether the answer has run past its time limit (Request.predict_limit_s), counted from its first token."""
    return req.predict_limit_s is not None and req.first_token_at is not None and \
        time.monotonic() - req.first_token_at > req.predict_limit_s


async def embedding(req: Request, scheduler: Scheduler, metrics: Metrics) -> tuple[float, ...]:
    """An embed request (GEN embed=1) run to its end: the vector of its EMB line, once its DONE is in
    (after an engine death the request is read again and a new EMB comes: the last one counts)."""
    vector = None
    scheduler.submit(req)
    with Outcome(req, scheduler, metrics) as outcome:
        while True:
            event = await req.events.get()
            if isinstance(event, m.Embedding):
                vector = event.vector
            elif isinstance(event, m.Done):
                outcome.finished = True
                if vector is None:  # stopped (the server shutting down), or an engine that does not embed
                    raise GenerationError(f"the engine ended an embedding without its vector ({event.finish})",
                                          503 if event.finish == "cancel" else 500)
                metrics.requests.labels("stop").inc()
                return vector
            elif (error := failure(event)) is not None:
                raise error


def _finish(req: Request, reason: str, metrics: Metrics, done: m.Done | None = None,
            stop_sequence: str | None = None, logprobs: list[m.Token] | None = None,
            prompt_logprobs: list[m.Token] | None = None) -> Finished:
    metrics.requests.labels(reason).inc()
    return Finished(reason, len(req.prompt), req.generated, timings(req, done), stop_sequence, req.cached,
                    logprobs or [], prompt_logprobs or [])


def prompt_scores(req: Request, lines: dict[int, m.PromptLogprobs]) -> list[m.Token]:
    """The prompt's tokens with their log-probabilities (PLP lines), the first without one (nothing
    comes before it); empty if none were asked. Past the prompt (a continuation's) nothing is kept."""
    if not lines:
        return []
    out = [m.Token(req.prompt[0], req.id)]
    for start in sorted(lines):
        line = lines[start]
        for i, lp in enumerate(line.logprobs):
            if start + i < len(req.prompt):
                out.append(m.Token(req.prompt[start + i], req.id, lp, line.top[i] if line.top else ()))
    return out


def timings(req: Request, done: m.Done | None) -> dict:
    """Per-request figures in the words of docs/DESIGN.md (ms), returned with the response."""
    ms = lambda s: None if s is None else round(s * 1000, 3)  # noqa: E731
    out = {"queue_wait_ms": ms(req.queue_wait_s), "ttft_ms": ms(req.ttft_s), "parks": req.parks,
           "intake_ms": ms(req.made - req.arrived),
           "first_text_ms": ms(req.first_text_at and req.first_text_at - req.arrived),
           "first_text_token": req.first_text_token,
           "parked_ms": ms(req.parked_s), "engine_restarts": req.restarts}
    if done is not None:
        out |= {"prompt_ms": round(done.prompt_ms, 3), "decode_ms": round(done.decode_ms, 3),
                "park_copy_ms": float(done.extra.get("park_ms", 0)),
                "shared_ms": float(done.extra.get("shared_ms", 0))}  # others' decode steps during its read
        if "drafted" in done.extra:  # speculative decoding: tokens drafted, and those the model confirmed
            out |= {"drafted_tokens": int(done.extra["drafted"]), "accepted_tokens": int(done.extra["accepted"])}
    return out
