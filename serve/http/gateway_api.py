"""What routers and inference gateways read of this server, in the names they read it by.

The Shepherd Model Gateway (`smg`, SGLang's router) registers a worker by probing GET /v1/models,
/version, /server_info and /model_info (or their get_ forms), and its load monitor polls
GET /v1/loads?include=... every few seconds for SGLang's load report: one entry per data-parallel
rank (here each engine of --engines) with its running and waiting requests and KV tokens used of the total;
cache-aware routing and overload protection read those. /metrics adds vLLM's gauge names beside
the strata_ ones (serve/scheduling/metrics.py), which Kubernetes' Gateway API Inference Extension and llm-d
scrape. A parked read counts as waiting: it holds no place in the running batch.
"""
from __future__ import annotations

import time

from fastapi import APIRouter, Depends, Request as HTTPRequest

from engine import __version__
from serve.scheduling.metrics import load_counts, reuse_summary
from serve.http.deps import check_api_key, state_of

gateway = APIRouter()


def rank_load(rank: int, scheduler) -> dict:
    """One engine's entry of the load report."""
    kv = scheduler.kv_status()
    block = kv.get("kv_block", 0)
    total = kv.get("kv_blocks", 0) * block
    used = kv.get("used", 0) * block
    running, waiting = load_counts(scheduler)
    return {"dp_rank": rank, "num_running_reqs": running, "num_waiting_reqs": waiting,
            "num_used_tokens": used, "max_total_num_tokens": total,
            "token_usage": round(used / total, 4) if total else 0.0,
            "cache_hit_rate": reuse_summary(scheduler.reuse)["hit_rate"] or 0.0,
            "max_running_requests": scheduler.max_running, "utilization": round(running / scheduler.max_running, 4)}


def loads(state) -> dict:
    """SGLang's load report (GET /v1/loads): one entry per engine (its data-parallel rank)."""
    ranks = [rank_load(i, s) for i, s in enumerate(state.scheduler.schedulers)]
    used, total = sum(r["num_used_tokens"] for r in ranks), sum(r["max_total_num_tokens"] for r in ranks)
    return {"timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "version": __version__,
            "dp_rank_count": len(ranks), "loads": ranks,
            "aggregate": {"num_running_reqs": sum(r["num_running_reqs"] for r in ranks),
                          "num_waiting_reqs": sum(r["num_waiting_reqs"] for r in ranks),
                          "num_used_tokens": used, "max_total_num_tokens": total,
                          "token_usage": round(used / total, 4) if total else 0.0}}


def model_info(state) -> dict:
    settings = state.settings
    return {"model_path": str(settings.model_path), "tokenizer_path": str(settings.model_path),
            "served_model_name": settings.model_name, "is_generation": True, "context_length": state.ctx,
            "weight_version": "default"}


def server_info(state) -> dict:
    settings, scheduler = state.settings, state.scheduler
    return model_info(state) | {
        "version": __version__, "host": settings.host, "port": settings.port, "dp_size": settings.engines, "tp_size": 1,
        "max_running_requests": scheduler.max_running, "max_total_num_tokens": loads(state)["aggregate"]
        ["max_total_num_tokens"], "prefill_preempt": scheduler.preempt, "engine": state.engine.state.value}


@gateway.get("/version")
async def version():
    return {"version": __version__}


@gateway.get("/server_info")
@gateway.get("/get_server_info")
async def get_server_info(http: HTTPRequest):
    return server_info(state_of(http))


@gateway.get("/model_info")
@gateway.get("/get_model_info")
async def get_model_info(http: HTTPRequest):
    return model_info(state_of(http))


@gateway.get("/v1/loads", dependencies=[Depends(check_api_key)])
@gateway.get("/loads", dependencies=[Depends(check_api_key)])
async def get_loads(http: HTTPRequest):
    """`include` (core, queues, memory, ...) is accepted; the core fields answer every part asked."""
    return loads(state_of(http))
