"""GET /v1/events: the server's state pushed as server-sent events a few times a second, for a live
view of the scheduler (issue 27's page reads it; anyone may): every request in the engines with its
state (reading, decoding, paused, parked, queued) and prompt progress, the KV pool, the prefix
cache, token rates over the last interval, and running counts of parks and resumes (a view marks a
park or a resume where they change). One `event: state` message per interval; `hz` (0.5-10,
default 4) sets the rate; `model` (a server of several) watches that model, if it is loaded (409 if not,
404 for a name the server does not have), else the first one. The stream ends when the client leaves:
nothing is kept for it.

Message (JSON):
  t                  seconds since the server started
  engines            [{"index", "state", "queued", "running", "parked"}]
  requests           [{"id", "engine", "state", "prompt_tokens", "done", "generated", "priority",
                       "parks", "in_host", "age_s"}]
  kv                 the pool, summed over engines (/status's kv)
  rates              {"prompt_tok_s", "generated_tok_s"} over the last interval
  totals             {"prompt_tokens", "generated_tokens", "parks", "resumes", "requests"}
  waiting_for_memory true while an engine has deferred a request for memory
"""
from __future__ import annotations

import asyncio
import json
import time

from fastapi import APIRouter, Depends, Request as HTTPRequest
from fastapi.responses import StreamingResponse

from serve.api.errors import APIError
from serve.http.deps import SSE_HEADERS, check_api_key, state_of, watched_state

events = APIRouter()

TOTALS = {"prompt_tokens": "strata_prompt_tokens_total", "generated_tokens": "strata_generated_tokens_total",
          "parks": "strata_prefill_preemptions_total", "resumes": "strata_prefill_resumes_total",
          "drafted": "strata_spec_drafted_tokens_total", "accepted": "strata_spec_accepted_tokens_total"}
FINISH_REASONS = ("stop", "length", "cancelled", "error")  # strata_requests_total's labels


def request_rows(scheduler, index: int, now: float) -> list[dict]:
    def row(r, state: str) -> dict:
        return {"id": r.id, "engine": index, "state": state, "prompt_tokens": len(r.prompt), "done": r.prompt_done,
                "generated": r.generated, "priority": r.priority, "parks": r.parks, "in_host": r.in_host,
                "age_s": round(now - r.arrived, 3)}

    return ([row(r, "paused" if r.paused else "reading" if r.reading else "decoding") for r in scheduler.running]
            + [row(r, "parked") for r in scheduler.parked] + [row(r, "queued") for r in scheduler.waiting])


def totals(state) -> dict:
    """The running totals, read from the metrics' counters (one sample each, not a whole scrape)."""
    registry = state.metrics.registry
    out = {key: int(registry.get_sample_value(name) or 0) for key, name in TOTALS.items()}
    out["requests"] = int(sum(registry.get_sample_value("strata_requests_total", {"finish_reason": reason}) or 0
                              for reason in FINISH_REASONS))
    return out


def snapshot(state, now: float, count: dict, previous: tuple[float, dict] | None) -> dict:
    """The message at monotonic time `now` with these totals; previous: (time, totals) of the last
    message sent on this stream (for the rates)."""
    router = state.scheduler
    rates = {"prompt_tok_s": 0.0, "generated_tok_s": 0.0}
    if previous is not None:
        dt = max(1e-3, now - previous[0])
        rates = {rate: round((count[key] - previous[1][key]) / dt, 1)
                 for rate, key in (("prompt_tok_s", "prompt_tokens"), ("generated_tok_s", "generated_tokens"))}
    return {"t": round(time.time() - state.started_at, 3),
            "engines": [{"index": i, "state": s.engine.state.value if s.engine else None, "queued": len(s.waiting),
                         "running": len(s.running), "parked": len(s.parked)} for i, s in enumerate(router.schedulers)],
            "requests": [row for i, s in enumerate(router.schedulers) for row in request_rows(s, i, now)],
            "kv": router.kv_status(), "rates": rates, "totals": count, "waiting_for_memory": router.memory_full}


@events.get("/v1/events", dependencies=[Depends(check_api_key)])
async def state_events(http: HTTPRequest, hz: float = 4.0, model: str | None = None):
    if not 0.5 <= hz <= 10:
        raise APIError(400, f"hz must be within 0.5 and 10, got {hz:g}", param="hz")
    state = state_of(http) if model is None else watched_state(http, model)

    async def stream():
        state.event_streams += 1
        previous = None
        try:
            while True:
                now, count = time.monotonic(), totals(state)
                yield f"event: state\ndata: {json.dumps(snapshot(state, now, count, previous))}\n\n"
                previous = now, count
                await asyncio.sleep(1 / hz)
        finally:  # the client left (the response is cancelled) or the server stops
            state.event_streams -= 1

    return StreamingResponse(stream(), media_type="text/event-stream", headers=SSE_HEADERS)
