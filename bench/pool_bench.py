"""Issue 21's table through HTTP, against any server of the OpenAI chat API: Strata or llama.cpp's
llama-server, already running at --url, measured by this one client (run it once per server, the
same flags, on the same machine; the device step `peers` in tools/device/gpu_run.sh does both).

    python bench/pool_bench.py --url http://127.0.0.1:8080 --label NAME [--cases hol,clients,subagents,agent,kv]
        [--repeats 3] [--json FILE] [--tokenizer GGUF] [--server-flags "how the server was started"]
        [--a-tokens 46900] [--decoders 4,16,64] [--decode-tokens 1500] [--b-delay 2]
        [--clients 64] [--client-words 300] [--client-tokens 256]
        [--agents 16] [--system-tokens 5900] [--tail-tokens 300] [--agent-answer 16]
        [--turns 20] [--loop-context 30000] [--tool-tokens 200] [--turn-answer 100]
        [--conversations 4] [--conversation-tokens 500]

Cases (each repeated --repeats times; medians are reported beside every run's figures):
- hol: N clients stream long answers (--decode-tokens each; one that ends is sent again, so N stream
  throughout), A (--a-tokens prompt tokens to /v1/completions, 4 generated) is sent, and B (a short
  streamed chat, 16 tokens) --b-delay s after A. B's first token is timed from B's send. N takes
  each value of --decoders; B alone on the idle server first. A's prompt is rotated each run, so
  no run finds it in a prefix cache.
- clients: --clients requests at once, each its own ~--client-words-word prompt and --client-tokens
  tokens: TTFT p50 / p99 / max, and tokens a second (all completion tokens over the wall time from
  the first send to the last token; and the decode part: tokens after each one's first, over the
  time from the first first-token to the last token).
- subagents: one request with a --system-tokens system prompt and its own --tail-tokens message
  (the agent), then --agents requests at once with the same system prompt and their own tails.
  TTFT p50 / max and usage.prompt_tokens_details.cached_tokens (llama.cpp: also timings.cache_n).
  A fresh system prompt each repeat, so the agent really is the first to read it.
- agent: one agent's loop of --turns turns, the conversation growing to about --loop-context tokens:
  each turn re-sends it with the previous answer (--turn-answer tokens, ignore_eos) and a tool
  result (--tool-tokens) appended. TTFT of the first turn, p50 / max of the later ones, and the
  tokens each reused. A fresh conversation each repeat.
- kv (Strata only: GET /status's "kv", the engine's pool as it last reported it, at a GEN or a DONE):
  before, the report with the most blocks in use while --conversations requests of about
  --conversation-tokens tokens each (80% prompt, 20% answer) run, and after they have finished:
  blocks still held by a request (used) and kept only as prefix cache (idle, evictable).

Decoders and clients send `ignore_eos` (llama.cpp honours it; Strata ignores unknown fields, so on
a random model a Strata stream can end early on an end token: completion tokens are counted from
usage, never assumed). Prompts are sized with the tokenizer of --tokenizer (a GGUF; default: the
model Strata would load: $STRATA_MODEL, else the default model).
"""
from __future__ import annotations

import argparse
import asyncio
import gc
import json
import multiprocessing
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from engine_bench import machine, merge_result  # noqa: E402
from mixed_load_bench import story_body  # noqa: E402
from prefill_preempt_bench import long_prompt, send_a, send_b  # noqa: E402
from sse_client import StreamRefused, stream_chunks  # noqa: E402

CASES = ("hol", "clients", "subagents", "agent", "kv")
# bench/subagent_bench.py's words: that module imports openai, which the device image lacks
WORDS = ("alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar papa "
         "quebec romeo sierra tango uniform victor whiskey xray yankee zulu").split()
TIMEOUT_S = 900


# ---------------------------------------------------------------- the server and the machine

def server_facts(url: str) -> dict:
    """Which server it is and what it says of itself: Strata's /status, else llama.cpp's /props."""
    try:
        r = httpx.get(url + "/status", timeout=10)
        if r.status_code == 200 and "engine_info" in r.json():
            s = r.json()
            return {"kind": "strata", "engine_info": s["engine_info"], "max_running": s.get("max_running"),
                    "kv": s.get("kv"), "preempt": s.get("preempt")}
    except (httpx.HTTPError, ValueError):
        pass
    r = httpx.get(url + "/props", timeout=10)
    r.raise_for_status()
    props = r.json()
    keep = {k: v for k, v in props.items() if k not in ("chat_template", "chat_template_tool_use", "webui_settings")}
    settings = props.get("default_generation_settings", {})
    keep["default_generation_settings"] = {k: settings.get(k) for k in ("n_ctx", "id", "speculative")
                                           if k in settings}
    return {"kind": "llama.cpp", "props": keep}


def gpu_name() -> str | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20).stdout.strip()
        return out.splitlines()[0] if out else None
    except (OSError, subprocess.SubprocessError):
        return None


def strata_kv(url: str) -> dict:
    return httpx.get(url + "/status", timeout=10).json().get("kv", {})


# ---------------------------------------------------------------- prompts

def words(rng: np.random.Generator, n: int) -> str:
    return " ".join(rng.choice(WORDS, n))


def text_of_tokens(tokenizer, rng: np.random.Generator, n: int) -> str:
    """Random words that the tokenizer reads as at most n tokens (the most words that do)."""
    pool = list(rng.choice(WORDS, 2 * n))
    lo, hi = 1, len(pool)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if len(tokenizer.encode(" ".join(pool[:mid]), add_bos=False)) <= n:
            lo = mid
        else:
            hi = mid - 1
    return " ".join(pool[:lo])


# ---------------------------------------------------------------- one streamed chat request

def chat(url: str, messages: list[dict], max_tokens: int, temperature: float = 0.0, seed: int | None = None,
         ignore_eos: bool = False, stamps: list[float] | None = None) -> dict:
    """One streamed chat request: send, first token (a chunk with content or reasoning), done; the
    usage and timings the server put in its last chunks."""
    body = {"messages": messages, "max_tokens": max_tokens, "temperature": temperature, "stream": True,
            "stream_options": {"include_usage": True}}
    body |= {"seed": seed} if seed is not None else {}
    body |= {"ignore_eos": True} if ignore_eos else {}
    out = {"sent": time.monotonic(), "first": None, "last": None, "done": None, "usage": None, "timings": None,
           "error": None, "chunks": 0, "text": ""}
    try:
        for chunk in stream_chunks(url, "/v1/chat/completions", body, TIMEOUT_S):
            delta = chunk["choices"][0].get("delta", {}) if chunk.get("choices") else {}
            if delta.get("content") or delta.get("reasoning_content"):
                out["text"] += delta.get("content") or ""
                now = time.monotonic()
                out["first"] = out["first"] or now
                out["last"], out["chunks"] = now, out["chunks"] + 1
                if stamps is not None:
                    stamps.append(now)
            out["usage"] = chunk.get("usage") or out["usage"]
            out["timings"] = chunk.get("timings") or out["timings"]
    except StreamRefused as e:
        out["error"] = str(e)
    except (httpx.HTTPError, ValueError, KeyError, IndexError) as e:  # transport, or a line that is not a chunk
        out["error"] = f"{type(e).__name__}: {e}"
    out["done"] = time.monotonic()
    return out


def completion_tokens(r: dict) -> int:
    if r["usage"]:
        return int(r["usage"].get("completion_tokens", 0))
    if r["timings"] and "predicted_n" in r["timings"]:
        return int(r["timings"]["predicted_n"])
    return r["chunks"]


def cached(r: dict) -> dict:
    details = (r["usage"] or {}).get("prompt_tokens_details") or {}
    out = {"prompt_tokens": (r["usage"] or {}).get("prompt_tokens"), "cached_tokens": details.get("cached_tokens")}
    if r["timings"] and "cache_n" in r["timings"]:
        out["cache_n"] = r["timings"]["cache_n"]
    return out


def at_once(n: int, fn) -> list:
    """fn(i) for i < n, each in its own thread, all released together."""
    gate, results = threading.Barrier(n), [None] * n

    def one(i):
        gate.wait()
        results[i] = fn(i)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def pct(values, q) -> float | None:
    return round(float(np.percentile(values, q)), 3) if values else None


def number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def medians(runs: list[dict]) -> dict:
    """Each figure's median over the runs that have it as a number (a run with no answer has no first-token time: the
    others' still count; None where no run has it)."""
    keys = dict.fromkeys(k for r in runs for k, v in r.items() if v is None or number(v))
    out = {}
    for k in keys:
        vals = [r[k] for r in runs if number(r.get(k))]
        m = statistics.median(vals) if vals else None
        out[k] = None if m is None else int(m) if float(m).is_integer() else round(m, 3)
    return out


# ---------------------------------------------------------------- hol: B beside A and N decoders

def chunk_tokens(line: str) -> int:
    """The tokens a streamed chunk carries, by its log-probabilities (0 for any other line): a token whose text is
    held back (a partial UTF-8 sequence, a special token) comes with the next one, whose gap is two tokens' time."""
    if not line.startswith("data: {"):
        return 0
    choices = json.loads(line[6:]).get("choices") or [{}]
    return len(((choices[0].get("logprobs") or {}).get("content")) or ())


def decode_streams(url: str, n: int, max_tokens: int, ready, stop, out) -> None:
    """In a process of its own: n streams decoding all along on one event loop, each started again when its answer
    ends, until `stop`; `ready` once each has streamed 4 chunks; then sends `out` (per stream, (monotonic time,
    tokens) of each chunk; the restarts). In the bench's own process 64 threads took turns at the GIL (a switch
    every 5 ms), and the time a chunk was seen could lag its arrival by tens of ms; CLOCK_MONOTONIC is the
    machine's, so the parent compares these times with its own. What the fork inherited (the tokenizer the parent
    loaded, ~44K objects) is frozen out of the collector's walks: a full collection over it took ~40 ms in a child on
    a small machine, a stall this client could add to the gaps it measures."""
    gc.freeze()
    stamps, restarts = [[] for _ in range(n)], [0] * n

    async def stream(client: httpx.AsyncClient, i: int) -> None:
        while True:
            began = time.monotonic()
            body = story_body(i, max_tokens) | {"logprobs": True}  # (each chunk's tokens: chunk_tokens)
            try:
                async with client.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=600) as r:
                    async for line in r.aiter_lines():
                        if tokens := chunk_tokens(line):
                            stamps[i].append((time.monotonic(), tokens))
            except httpx.HTTPError:
                pass
            restarts[i] += 1
            if time.monotonic() - began < 0.5:
                await asyncio.sleep(0.5)

    async def main() -> None:
        limits = httpx.Limits(max_connections=1024, max_keepalive_connections=0)
        async with httpx.AsyncClient(verify=False, limits=limits) as client:
            tasks = [asyncio.create_task(stream(client, i)) for i in range(n)]
            while not stop.is_set():
                if not ready.is_set() and min(len(s) for s in stamps) >= 4:
                    ready.set()
                await asyncio.sleep(0.01)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    asyncio.run(main())
    out.send((stamps, restarts))


def hol_run(url: str, n: int, prompt: list[int], a: argparse.Namespace) -> dict:
    fork = multiprocessing.get_context("fork")  # (the child takes none of this process's threads or clients)
    ready, stop = fork.Event(), fork.Event()
    results, sent = fork.Pipe(duplex=False)
    decoders = fork.Process(target=decode_streams, args=(url, n, a.decode_tokens, ready, stop, sent), daemon=True)
    began = time.monotonic()
    decoders.start()
    ready.wait(a.ready_timeout)  # all decoding
    ready_s = time.monotonic() - began
    a_out: dict = {}
    reader = threading.Thread(target=send_a, args=(url, prompt, 4, a_out), daemon=True)
    reader.start()
    time.sleep(a.b_delay)
    b = send_b(url, 16)
    reader.join(TIMEOUT_S)
    stop.set()
    stamps, restarts = results.recv() if results.poll(60) else ([[] for _ in range(n)], [0] * n)
    decoders.join(10)
    ready = sum(sum(t < a_out.get("sent", b["sent"]) for t, _ in s) >= 4 for s in stamps)
    b_first = b["first"] if b["first"] is not None else b["done"]
    a_from, a_to = a_out.get("sent", b["sent"]), a_out.get("done", b["done"])
    spans = [(t0, t1, k) for s in stamps for (t0, _), (t1, k) in zip(s, s[1:]) if a_from <= t0 and t1 <= a_to]
    gaps_ms = [(t1 - t0) * 1000 for t0, t1, _ in spans]  # the decoders' time between chunks while A was in the server
    token_ms = [(t1 - t0) * 1000 / k for t0, t1, k in spans]  # the same a token (a chunk of k tokens: k gaps)
    longest = sorted(spans, key=lambda span: span[0] - span[1])[:12]  # where the tail is
    timings = a_out.get("timings", {})
    return {"decoders": n, "decoders_ready": ready, "decoders_ready_s": round(ready_s, 3),
            "b_ttft_s": round(b_first - b["sent"], 3), "b_done_s": round(b["done"] - b["sent"], 3),
            "b_first_token_seen": b["first"] is not None, "b_queue_wait_ms": b["timings"].get("queue_wait_ms"),
            "a_wall_s": round(a_to - a_from, 3), "a_status": a_out.get("status"),
            "a_prompt_ms": timings.get("prompt_ms"), "a_cache_n": timings.get("cache_n"),
            "decoders_streaming_during_b": sum(any(b["sent"] <= t <= b["done"] for t, _ in s) for s in stamps),
            "decoder_restarts": sum(restarts), "decoder_chunks_during_a": len(spans),
            "decoder_gap_p50_ms": pct(gaps_ms, 50), "decoder_gap_p99_ms": pct(gaps_ms, 99),
            "decoder_gap_max_ms": round(max(gaps_ms), 3) if spans else None,
            "decoder_token_gap_p99_ms": pct(token_ms, 99), "decoder_held_chunks": sum(k > 1 for *_, k in spans),
            "b_sent_after_a_s": round(b["sent"] - a_from, 3),
            "decoder_gaps_longest": [[round(t1 - a_from, 3), round((t1 - t0) * 1000, 1), k]  # (ends after A's send, s;
                                     for t0, t1, k in longest]}  # ms; tokens)


def case_hol(url: str, a: argparse.Namespace, log, out: dict, save) -> dict:
    """Fills `out` (already in the result) and saves after each decoder count: the longest case."""
    alone = [send_b(url, 16) for _ in range(3)]
    out |= {"a_tokens": a.a_tokens, "b_delay_s": a.b_delay, "decode_tokens": a.decode_tokens, "b_tokens": 16,
           "b_alone_ttft_s": round(statistics.median((b["first"] or b["done"]) - b["sent"] for b in alone), 3),
           "b_alone_done_s": round(statistics.median(b["done"] - b["sent"] for b in alone), 3), "by_decoders": {}}
    log(f"hol: B alone TTFT {out['b_alone_ttft_s']} s, done {out['b_alone_done_s']} s")
    base = long_prompt(a.a_tokens)
    run_no = 0
    for n in a.decoders:
        runs = []
        for rep in range(a.repeats):
            run_no += 1
            shift = run_no * 997 % len(base)  # a different first token: no prefix cache holds it
            runs.append(hol_run(url, n, base[shift:] + base[:shift], a))
            log(f"hol N={n} run {rep + 1}: " + json.dumps(runs[-1]))
        out["by_decoders"][str(n)] = {"median": medians(runs), "runs": runs}
        m = out["by_decoders"][str(n)]["median"]
        log(f"hol N={n}: B TTFT median {m['b_ttft_s']} s (A wall {m['a_wall_s']} s)")
        save()
    return out


# ---------------------------------------------------------------- clients: many at once

def server_time(r: dict, key: str = "ttft_ms") -> float | None:
    """One of the server's own times (s), where its timings give it (Strata's, each from the request's arrival):
    ttft_ms (the default), first_text_ms (to its first text, which a token may not hold), intake_ms (before it went
    in line)."""
    ms = (r["timings"] or {}).get(key)
    return None if ms is None else round(ms / 1000, 3)


def clients_run(url: str, a: argparse.Namespace, rep: int) -> dict:
    rng = np.random.default_rng(1000 + rep)
    prompts = [f"Client {i} of run {rep}. " + words(rng, a.client_words) for i in range(a.clients)]
    rs = at_once(a.clients, lambda i: chat(url, [{"role": "user", "content": prompts[i]}], a.client_tokens,
                                             temperature=0.7, seed=i, ignore_eos=True))
    ok = [r for r in rs if r["first"] is not None]
    ttft = [r["first"] - r["sent"] for r in ok]
    tokens = [completion_tokens(r) for r in rs]
    wall = max(r["done"] for r in rs) - min(r["sent"] for r in rs)
    decode_window = max(r["last"] for r in ok) - min(r["first"] for r in ok) if ok else 0
    rates = [(completion_tokens(r) - 1) / (r["last"] - r["first"]) for r in ok if r["last"] > r["first"]]
    decoded = sum(completion_tokens(r) - 1 for r in ok)  # the tokens after each one's first
    server = [t for t in map(server_time, ok) if t is not None]
    slowest = max(ok, key=lambda r: r["first"] - r["sent"]) if ok else None
    sent = min(r["sent"] for r in rs)
    return {"clients": a.clients, "answered": len(ok), "errors": sorted({r["error"] for r in rs if r["error"]}),
            "ttft_p50_s": pct(ttft, 50), "ttft_p99_s": pct(ttft, 99), "ttft_max_s": pct(ttft, 100),
            "completion_tokens": sum(tokens), "completion_tokens_min": min(tokens), "wall_s": round(wall, 3),
            "aggregate_tok_s": round(sum(tokens) / wall, 1),
            "decode_tok_s": round(decoded / decode_window, 1) if decode_window else None,
            "per_client_decode_tok_s_p50": pct(rates, 50),
            "prompt_tokens_p50": pct([(r["usage"] or {}).get("prompt_tokens", 0) for r in rs], 50),
            # where the slowest first token's time went: the server's own count (from the request's arrival, where it
            # says: Strata's timings) and when the client sent it
            "server_ttft_p99_s": pct(server, 99), "sent_spread_s": round(max(r["sent"] for r in rs) - sent, 3),
            "slowest": slowest and {"ttft_s": round(slowest["first"] - slowest["sent"], 3),
                                    "sent_after_s": round(slowest["sent"] - sent, 3),
                                    "server_ttft_s": server_time(slowest),
                                    "server_intake_s": server_time(slowest, "intake_ms"),
                                    "server_first_text_s": server_time(slowest, "first_text_ms"),
                                    "first_text_token": (slowest["timings"] or {}).get("first_text_token")}}


def repeated(name: str, run, a: argparse.Namespace, log, settings: dict, shown=lambda r: r) -> dict:
    """run(rep) for each of --repeats, each run's figures logged (what `shown` keeps of them): the case's
    settings, the runs' medians and the runs."""
    runs = []
    for rep in range(a.repeats):
        runs.append(run(rep))
        log(f"{name} run {rep + 1}: " + json.dumps(shown(runs[-1])))
    return {**settings, "median": medians(runs), "runs": runs}


def case_clients(url: str, a: argparse.Namespace, log) -> dict:
    out = repeated("clients", lambda rep: clients_run(url, a, rep), a, log,
                   {"clients": a.clients, "client_words": a.client_words, "client_tokens": a.client_tokens})
    m = out["median"]
    log(f"clients: TTFT p50 {m['ttft_p50_s']} s p99 {m['ttft_p99_s']} s; {m['aggregate_tok_s']} tok/s aggregate, "
        f"{m['decode_tok_s']} decode")
    return out


# ---------------------------------------------------------------- subagents: a shared system prompt

def subagents_run(url: str, a: argparse.Namespace, tokenizer, rep: int) -> dict:
    rng = np.random.default_rng(2000 + rep)
    system = text_of_tokens(tokenizer, rng, a.system_tokens)
    tails = [text_of_tokens(tokenizer, rng, a.tail_tokens) for _ in range(a.agents + 1)]
    msgs = lambda tail: [{"role": "system", "content": system}, {"role": "user", "content": tail}]  # noqa: E731
    agent = chat(url, msgs(tails[0]), a.agent_answer)
    subs = at_once(a.agents, lambda i: chat(url, msgs(tails[i + 1]), a.agent_answer))
    ttft = [(r["first"] or r["done"]) - r["sent"] for r in subs]
    c = [cached(r) for r in subs]
    out = {"agent_ttft_s": round((agent["first"] or agent["done"]) - agent["sent"], 3),
           "agent_prompt_tokens": cached(agent)["prompt_tokens"], "agent_cached_tokens": cached(agent)["cached_tokens"],
           "system_tokens": len(tokenizer.encode(system, add_bos=False)), "agents": a.agents,
           "ttft_p50_s": round(statistics.median(ttft), 3), "ttft_max_s": round(max(ttft), 3),
           "all_first_token_seen": all(r["first"] is not None for r in subs),
           "errors": sorted({r["error"] for r in subs + [agent] if r["error"]}),
           "prompt_tokens_p50": statistics.median(x["prompt_tokens"] or 0 for x in c),
           "cached_tokens_min": min(x["cached_tokens"] or 0 for x in c),
           "cached_tokens_max": max(x["cached_tokens"] or 0 for x in c)}
    if any("cache_n" in x for x in c):
        out["cache_n_min"] = min(x.get("cache_n", 0) for x in c)
        out["cache_n_max"] = max(x.get("cache_n", 0) for x in c)
    return out


def case_subagents(url: str, a: argparse.Namespace, tokenizer, log) -> dict:
    out = repeated("subagents", lambda rep: subagents_run(url, a, tokenizer, rep), a, log,
                   {"agents": a.agents, "system_tokens": a.system_tokens, "tail_tokens": a.tail_tokens,
                    "answer_tokens": a.agent_answer})
    m = out["median"]
    log(f"subagents: TTFT p50 {m['ttft_p50_s']} s max {m['ttft_max_s']} s; cached {m['cached_tokens_min']}.."
        f"{m['cached_tokens_max']} (system prompt {m['system_tokens']} tokens)")
    return out


# ---------------------------------------------------------------- agent: one conversation's turns

def agent_run(url: str, a: argparse.Namespace, tokenizer, rep: int) -> dict:
    """One agent's loop: a first prompt of --loop-context tokens less what the turns add, then --turns
    turns, each the conversation so far re-sent with the previous answer (--turn-answer tokens, as the
    server wrote it) and a tool result of --tool-tokens tokens appended. TTFT per turn."""
    rng = np.random.default_rng(3000 + rep)
    first = a.loop_context - a.turns * (a.tool_tokens + a.turn_answer)
    messages = [{"role": "system", "content": text_of_tokens(tokenizer, rng, first)},
                {"role": "user", "content": "Begin the task. " + text_of_tokens(tokenizer, rng, a.tool_tokens)}]
    turns = []
    for turn in range(1, a.turns + 1):
        r = chat(url, messages, a.turn_answer, ignore_eos=True)
        turns.append({"turn": turn, "ttft_s": round((r["first"] or r["done"]) - r["sent"], 3), **cached(r),
                      "error": r["error"]})
        messages += [{"role": "assistant", "content": r["text"]},
                     {"role": "user", "content": "Tool result: " + text_of_tokens(tokenizer, rng, a.tool_tokens)}]
    later = [t["ttft_s"] for t in turns[1:]]
    return {"first_turn_ttft_s": turns[0]["ttft_s"], "later_ttft_p50_s": round(statistics.median(later), 3),
            "later_ttft_max_s": max(later), "last_prompt_tokens": turns[-1]["prompt_tokens"],
            "later_cached_min": min(t["cached_tokens"] or 0 for t in turns[1:]),
            "errors": sorted({t["error"] for t in turns if t["error"]}), "turns": turns}


def case_agent(url: str, a: argparse.Namespace, tokenizer, log) -> dict:
    out = repeated("agent", lambda rep: agent_run(url, a, tokenizer, rep), a, log,
                   {"turns": a.turns, "loop_context": a.loop_context, "tool_tokens": a.tool_tokens,
                    "turn_answer": a.turn_answer}, shown=lambda r: {k: v for k, v in r.items() if k != "turns"})
    m = out["median"]
    log(f"agent: first turn TTFT {m['first_turn_ttft_s']} s; later turns p50 {m['later_ttft_p50_s']} s "
        f"max {m['later_ttft_max_s']} s ({m['last_prompt_tokens']} tokens at the last)")
    return out


# ---------------------------------------------------------------- kv: what finished conversations hold

def kv_bytes(kv: dict) -> dict:
    block = kv.get("kv_block_bytes", 0)
    return {"pool_bytes": kv.get("kv_blocks", 0) * block, "used_bytes": kv.get("used", 0) * block,
            "idle_cached_bytes": kv.get("idle", 0) * block}


def case_kv(url: str, a: argparse.Namespace, tokenizer, facts: dict, log) -> dict:
    if facts["kind"] != "strata":
        return {"skipped": "GET /status with a KV pool is Strata's"}
    rng = np.random.default_rng(3000)
    answer = max(1, a.conversation_tokens // 5)
    prompts = [text_of_tokens(tokenizer, rng, a.conversation_tokens - answer) for _ in range(a.conversations)]
    before = strata_kv(url)
    during: list[dict] = []
    done = threading.Event()

    def watch():  # the engine reports its pool at each GEN and DONE: the report that showed the most in use
        while not done.is_set():
            kv = strata_kv(url)
            if not during or kv.get("used", 0) > during[0].get("used", 0):
                during[:] = [kv]
            time.sleep(0.05)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    rs = at_once(a.conversations, lambda i: chat(url, [{"role": "user", "content": prompts[i]}], answer,
                                                 temperature=0.7, seed=i, ignore_eos=True))
    done.set()
    watcher.join(10)
    time.sleep(0.5)  # the engine's pool report follows its DONE line
    after = strata_kv(url)
    tokens = [(r["usage"] or {}).get("prompt_tokens", 0) + completion_tokens(r) for r in rs]
    size = after.get("kv_block") or 1
    out = {"conversations": a.conversations, "tokens_each": tokens,
           "their_blocks": sum(-(-t // size) for t in tokens), "before": before | kv_bytes(before),
           "peak_during": (during[0] | kv_bytes(during[0])) if during else None, "after": after | kv_bytes(after),
           "held_after_bytes": (after.get("used", 0) - before.get("used", 0)) * after.get("kv_block_bytes", 0),
           "cached_after_bytes": (after.get("idle", 0) - before.get("idle", 0)) * after.get("kv_block_bytes", 0)}
    peak = (during[0] if during else {}).get("used")
    log(f"kv: {a.conversations} conversations of {tokens} tokens; used blocks before/peak/after "
        f"{before.get('used')}/{peak}/{after.get('used')} of {after.get('kv_blocks')} "
        f"({after.get('kv_block_bytes')} bytes each); idle cached {before.get('idle')} -> {after.get('idle')}")
    return out


# ---------------------------------------------------------------- warm-up and main

def warm_up(url: str, a: argparse.Namespace, log) -> None:
    """First requests compile kernels and capture graphs: a short one, then as many at once as the
    largest case runs, then a 2,048-token read; none of it is measured."""
    began = time.monotonic()
    send_b(url, 16)
    n = max([*a.decoders, a.clients, a.agents, 1])
    at_once(n, lambda i: chat(url, [{"role": "user", "content": f"Warm-up {i}: say something."}], 8, seed=i))
    a_out: dict = {}
    send_a(url, long_prompt(min(2048, a.a_tokens))[::-1], 4, a_out)
    log(f"warm-up: {time.monotonic() - began:.1f} s")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", required=True, help="the running server, e.g. http://127.0.0.1:8080")
    p.add_argument("--label", required=True, help="the entry's name in --json (e.g. strata, llama.cpp)")
    p.add_argument("--cases", default=",".join(CASES), help=f"a comma list of {', '.join(CASES)}")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json")
    p.add_argument("--tokenizer", help="GGUF whose tokenizer sizes the prompts (default: $STRATA_MODEL or the default)")
    p.add_argument("--server-flags", default="", help="how the server was started (recorded)")
    p.add_argument("--server-version", default="", help="where the server's build came from (recorded)")
    p.add_argument("--no-warm-up", action="store_true")
    p.add_argument("--a-tokens", type=int, default=46900)
    p.add_argument("--decoders", default="4,16,64")
    p.add_argument("--decode-tokens", type=int, default=1500)
    p.add_argument("--b-delay", type=float, default=2.0)
    p.add_argument("--ready-timeout", type=float, default=300.0, help="seconds for all decoders to be streaming")
    p.add_argument("--clients", type=int, default=64)
    p.add_argument("--client-words", type=int, default=300)
    p.add_argument("--client-tokens", type=int, default=256)
    p.add_argument("--agents", type=int, default=16)
    p.add_argument("--system-tokens", type=int, default=5900)
    p.add_argument("--tail-tokens", type=int, default=300)
    p.add_argument("--agent-answer", type=int, default=16)
    p.add_argument("--turns", type=int, default=20, help="agent: the loop's turns")
    p.add_argument("--loop-context", type=int, default=30000, help="agent: the conversation's tokens at the last turn")
    p.add_argument("--tool-tokens", type=int, default=200, help="agent: each turn's tool result")
    p.add_argument("--turn-answer", type=int, default=100, help="agent: each turn's answer")
    p.add_argument("--conversations", type=int, default=4)
    p.add_argument("--conversation-tokens", type=int, default=500)
    a = p.parse_args()
    a.decoders = [int(x) for x in a.decoders.split(",") if x]
    cases = [c for c in a.cases.split(",") if c]
    if unknown := set(cases) - set(CASES):
        p.error(f"unknown cases {sorted(unknown)}")
    if a.tokenizer:
        os.environ["STRATA_MODEL"] = a.tokenizer  # long_prompt() reads the model Strata would load
    from engine.modelfile.model_path import resolve_model_path
    from engine.modelfile.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(str(resolve_model_path(a.tokenizer)))
    url = a.url.rstrip("/")
    began = time.monotonic()

    def log(msg: str) -> None:
        print(f"[{a.label} {time.monotonic() - began:6.1f}s] {msg}", flush=True)

    facts = server_facts(url)
    gpu = gpu_name()
    device = gpu or (facts.get("engine_info") or {}).get("device", "cpu")
    result = {"label": a.label, "server": facts["kind"], "server_flags": a.server_flags,
              "server_version": a.server_version, "url": url,
              "machine": machine(device), "python": platform.python_version(), "repeats": a.repeats,
              "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "server_facts": facts, "cases": {}}
    log(f"{facts['kind']} at {url}; {result['machine']}")

    def save() -> None:
        if a.json:
            merge_result(Path(a.json), a.label, result)

    save()
    if not a.no_warm_up:
        warm_up(url, a, log)
    order = [c for c in ("kv", "hol", "clients", "subagents", "agent") if c in cases]  # kv first: the pool is clean
    for case in order:
        t0 = time.monotonic()
        if case == "hol":
            result["cases"]["hol"] = {}
            case_hol(url, a, log, result["cases"]["hol"], save)
        elif case == "clients":
            result["cases"]["clients"] = case_clients(url, a, log)
        elif case == "subagents":
            result["cases"]["subagents"] = case_subagents(url, a, tokenizer, log)
        elif case == "agent":
            result["cases"]["agent"] = case_agent(url, a, tokenizer, log)
        else:
            result["cases"]["kv"] = case_kv(url, a, tokenizer, facts, log)
        result["cases"][case]["case_s"] = round(time.monotonic() - t0, 1)
        save()  # what is done so far survives a run cut short
    if facts["kind"] == "strata":
        result["server_facts_after"] = server_facts(url)
    result["total_s"] = round(time.monotonic() - began, 1)
    save()
    log(f"done in {result['total_s']} s" + (f"; wrote {a.json}" if a.json else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
