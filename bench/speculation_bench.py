"""Speculative decoding on real trained models (issue 47): five agent workloads through HTTP, each server
started as a user starts it, greedy, the same GGUF files for every arm:

  strata off      python -m serve --model M --speculative off
  strata ngram    ... --speculative ngram (drafts from the request's own context)
  strata draft    ... --speculative draft --draft D (a smaller model of the same vocabulary drafts)
  llama off       llama-server -m M --jinja           (with --llama-server BIN; its defaults otherwise)
  llama ngram     ... --spec-type ngram-simple
  llama draft     ... -md D --spec-type draft-simple

The workloads (WORKLOADS): `rewrite` gives a ~1,500-token Python file back with one line changed, `question`
asks about that file, `tool` edits it through a tool call that quotes the lines it replaces, `write` saves the
changed file whole through a tool call (its text JSON-escaped in the call's arguments), `chat` is free prose
(--workloads picks some). The file is the class TextWrapper of the running Python's textwrap module, cut after its method _split.

Per workload and arm: completion tokens, decode tokens per second by the server's own clock (the response's
`timings`: Strata's decode_ms, llama-server's predicted_ms, so the prompt read and HTTP are out of it), the
tokens drafted and accepted, and whether the text (content and tool calls) equals the same server's arm
without drafts: greedy decoding with drafts must give the same text (Strata promises it; llama.cpp does not).
With --concurrency N, also N requests at once, the workloads in turn (row `together`: aggregate tok/s of
wall time, the median request's decode tok/s, and every request's text against the arm without drafts).
Medians over --repeats. Defaults: Qwen2.5-Coder-1.5B-Instruct drafted for by Qwen2.5-Coder-0.5B-Instruct, both
Q4_K_M (tools/fixtures/fetch_fixture.py --model coder-1.5b / coder-0.5b fetches and checks them).

    python bench/speculation_bench.py [--model M] [--draft D] [--device cpu|gpu] [--max-tokens 256]
        [--repeats 1] [--concurrency N] [--arms off,ngram,draft] [--workloads rewrite,...] [--show-text]
        [--llama-server BIN [--llama-args "..."] [--llama-arms off,ngram,draft]]
        [--label NAME --json FILE] [-- strata server flags...]

Exit status 1 if an arm failed (the others still run; the JSON is written after each arm) or a Strata arm's text
differed from its arm without drafts.
"""
from __future__ import annotations

import argparse
import inspect
import shlex
import statistics
import sys
import tempfile
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.clients_bench import free_port, start_server, stop_server, wait_healthy  # noqa: E402
from bench.engine_bench import machine, merge_result  # noqa: E402
from bench.pool_bench import gpu_name  # noqa: E402
from tools.fixtures.fetch_fixture import fetch, cache_dir  # noqa: E402

FILE_CHARS = 7000  # the most characters of code: ~1,550 tokens (__init__, _munge_whitespace, _split)


def source_file() -> str:
    """TextWrapper's source, cut before the last method that does not end within FILE_CHARS characters."""
    src = inspect.getsource(textwrap.TextWrapper)
    return src[: src.rindex("\n\n    def ", 0, FILE_CHARS) + 1]


EDIT_FILE = {"type": "function", "function": {
    "name": "edit_file", "description": "Replace an exact run of lines of a file by new lines.",
    "parameters": {"type": "object", "required": ["path", "old_text", "new_text"], "properties": {
        "path": {"type": "string"}, "old_text": {"type": "string", "description": "the lines to replace, verbatim"},
        "new_text": {"type": "string", "description": "the lines that replace them"}}}}}


WRITE_FILE = {"type": "function", "function": {
    "name": "write_file", "description": "Write a file whole, replacing what it held.",
    "parameters": {"type": "object", "required": ["path", "content"], "properties": {
        "path": {"type": "string"}, "content": {"type": "string", "description": "the new content of the file"}}}}}


def workloads(code: str) -> dict[str, dict]:
    """name -> the chat request's fields besides model, max_tokens and temperature."""
    fenced = f"```python\n{code}```"
    methods = "class TextWrapper:" + code[code.index("\n    def "):]  # (the class without its docstring)
    return {
        "rewrite": {"messages": [{"role": "user", "content": (
            f"Here is textwrap.py:\n\n{fenced}\n\nGive back the whole file with one change: the default width in "
            "__init__ is 80 instead of 70. Output only the code, in one fenced block.")}]},
        "question": {"messages": [{"role": "user", "content": (
            f"{fenced}\n\nWhat does _split do when break_on_hyphens is false, and which regular expression "
            "does it use then? Quote the lines that decide it.")}]},
        "tool": {"messages": [{"role": "user", "content": (
            f"This is textwrap.py:\n\n{fenced}\n\nIn _munge_whitespace, expand tabs to 4 spaces always instead of "
            "self.tabsize. Make the change with edit_file, quoting the exact old lines.")}],
            "tools": [EDIT_FILE], "tool_choice": "required"},
        "write": {"messages": [{"role": "user", "content": (  # (the class's methods without its docstring: a call
            # of ~650 tokens, whole within its max_tokens, so that its text is compared)
            f"This is textwrap.py:\n\n```python\n{methods}```\n\n"
            "Change the default width in __init__ from 70 to 80. Call write_file with path textwrap.py and, as "
            "content, the whole file with that change.")}], "tools": [WRITE_FILE], "tool_choice": "required",
            "max_tokens": 1024},
        "chat": {"messages": [{"role": "user", "content": (
            "Write a short story, about 250 words, about a lighthouse keeper who teaches herself to program "
            "during one long winter.")}]},
    }


def ask(url: str, body: dict, timeout_s: float) -> dict:
    """One non-streamed chat completion -> text, tokens, decode seconds, drafted, accepted."""
    r = httpx.post(url + "/v1/chat/completions", json=body, timeout=timeout_s)
    r.raise_for_status()
    out = r.json()
    msg = out["choices"][0]["message"]
    calls = [(c["function"]["name"], c["function"]["arguments"]) for c in msg.get("tool_calls") or []]
    t = out.get("timings") or {}
    if "decode_ms" in t:  # Strata
        decode_ms, drafted, accepted = t["decode_ms"], t.get("drafted_tokens", 0), t.get("accepted_tokens", 0)
    else:  # llama-server
        decode_ms, drafted, accepted = t.get("predicted_ms", 0.0), t.get("draft_n", 0), t.get("draft_n_accepted", 0)
    tokens = out["usage"]["completion_tokens"]
    return {"text": (msg.get("content") or "") + repr(calls), "tokens": tokens,
            "decode_tok_s": round(tokens / (decode_ms / 1000), 2) if decode_ms else None,
            "drafted": drafted, "accepted": accepted}


def run_arm(cmd: list[str], url: str, cases: dict[str, dict], a: argparse.Namespace, log: Path) -> dict:
    """Start the server, send each workload --repeats times (one at a time), stop it."""
    proc = start_server(cmd, log)
    try:
        wait_healthy(proc, url, log, a.start_timeout)
        ask(url, {"messages": [{"role": "user", "content": "Hello."}], "max_tokens": 8, "temperature": 0},
            a.timeout)  # warm-up
        rows = {}
        for name, fields in cases.items():
            runs = [ask(url, {"max_tokens": a.max_tokens, "temperature": 0, **fields}, a.timeout)  # (a workload's own
                    # max_tokens first)
                    for _ in range(a.repeats)]
            rows[name] = {"text": runs[0]["text"], "tokens": runs[0]["tokens"],
                          "decode_tok_s": statistics.median(r["decode_tok_s"] or 0 for r in runs),
                          "drafted": runs[0]["drafted"], "accepted": runs[0]["accepted"],
                          "same_each_repeat": all(r["text"] == runs[0]["text"] for r in runs)}
        if a.concurrency > 1:
            rows["together"] = together(url, cases, a, rows)
        return rows
    finally:
        stop_server(proc)


def together(url: str, cases: dict[str, dict], a: argparse.Namespace, alone: dict[str, dict]) -> dict:
    """--concurrency requests at once, the workloads in turn (an agent's sub-agents and a chat beside them), the
    median of --repeats rounds: aggregate completion tokens a second of wall time (prompt reads included), and the
    median request's decode tok/s by the server's clock. Its text: every request's, in order (each must be the
    one it gives alone, drafts or not: `same_as_alone`, against `alone`, the arm's rows so far)."""
    names = (list(cases) * (a.concurrency // len(cases) + 1))[: a.concurrency]
    bodies = [{"max_tokens": a.max_tokens, "temperature": 0, **cases[name]} for name in names]
    rounds = []
    with ThreadPoolExecutor(a.concurrency) as pool:
        for _ in range(a.repeats):
            started = time.perf_counter()
            answers = list(pool.map(lambda body: ask(url, body, a.timeout), bodies))
            rounds.append((time.perf_counter() - started, answers))
    wall, answers = sorted(rounds, key=lambda r: r[0])[len(rounds) // 2]
    tokens = sum(r["tokens"] for r in answers)
    return {"text": "\n".join(r["text"] for r in answers), "tokens": tokens,
            "decode_tok_s": statistics.median(r["decode_tok_s"] or 0 for r in answers),
            "aggregate_tok_s": round(tokens / wall, 2), "requests": a.concurrency,
            "drafted": sum(r["drafted"] for r in answers), "accepted": sum(r["accepted"] for r in answers),
            "same_each_repeat": all(x["text"] == y["text"] for _, rs in rounds for x, y in zip(rs, answers)),
            "same_as_alone": all(r["text"] == alone[name]["text"] for name, r in zip(names, answers))}


def arms(a: argparse.Namespace, port: int, extra: list[str]) -> dict[str, list[str]]:
    """arm name -> its server command."""
    strata = [sys.executable, "-m", "serve", "--model", a.model, "--device", a.device, "--port", str(port), *extra]
    out = {f"strata {s}": strata + ["--speculative", s] + (["--draft", a.draft] if s == "draft" else [])
           for s in a.arms.split(",") if s}
    if a.llama_server:
        llama = [a.llama_server, "-m", a.model, "--port", str(port), "--jinja", *shlex.split(a.llama_args)]
        flags = {"off": [], "ngram": ["--spec-type", "ngram-simple"],
                 "draft": ["-md", a.draft, "--spec-type", "draft-simple"]}
        out.update({f"llama {s}": llama + flags[s] for s in a.llama_arms.split(",") if s})
    return out


def compare(result: dict) -> bool:
    """Each arm's rows against its server's arm without drafts: `same_text` and `vs_off` (its decode tok/s over the
    off arm's). False if a Strata arm's text differs."""
    exact = True
    for arm, rows in result.items():
        base = result.get(arm.split()[0] + " off")
        if "error" in rows or base is None or "error" in base:
            continue
        for name, row in rows.items():
            row["same_text"] = row["text"] == base[name]["text"]
            off = base[name]["decode_tok_s"]
            row["vs_off"] = round(row["decode_tok_s"] / off, 3) if off else None
            if "aggregate_tok_s" in row:
                row["aggregate_vs_off"] = round(row["aggregate_tok_s"] / base[name]["aggregate_tok_s"], 3)
            exact = exact and ((row["same_text"] and row.get("same_as_alone", True)) or not arm.startswith("strata"))
    return exact


def save(a: argparse.Namespace, result: dict) -> None:
    """The result so far into --json (after each arm: a later arm's failure loses nothing)."""
    if a.json:
        merge_result(Path(a.json), a.label or f"{a.device} speculation", {
            "machine": a.machine, "model": Path(a.model).name, "draft": Path(a.draft).name if a.draft else None,
            "max_tokens": a.max_tokens, "repeats": a.repeats, "python": sys.version.split()[0],
            "arms": {arm: rows if "error" in rows else {n: {k: v for k, v in r.items() if k != "text"}
                                                        for n, r in rows.items()} for arm, rows in result.items()}})


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help="the target GGUF (default: the Qwen2.5-Coder-1.5B fixture)")
    p.add_argument("--draft", help="the draft GGUF (default: the Qwen2.5-Coder-0.5B fixture)")
    p.add_argument("--device", default="cpu", choices=("cpu", "gpu"))
    p.add_argument("--arms", default="off,ngram,draft",
                   help="Strata's --speculative values to run, in order (empty: none)")
    p.add_argument("--workloads", default="rewrite,question,tool,write,chat", help="the workloads to run, in order")
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--concurrency", type=int, default=1,
                   help="also send this many requests at once, the workloads in turn (row `together`)")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds a request may take")
    p.add_argument("--start-timeout", type=float, default=900.0)
    p.add_argument("--llama-server", help="llama-server's binary: its arms beside Strata's")
    p.add_argument("--llama-args", default="", help="more llama-server flags (-t 2, -ngl 99 -fa on, ...)")
    p.add_argument("--llama-arms", default="off,ngram,draft", help="llama-server's arms to run, in order")
    p.add_argument("--show-text", action="store_true", help="print each workload's text (its first 600 characters)")
    p.add_argument("--label")
    p.add_argument("--json")
    a, extra = p.parse_known_args()
    a.machine = machine((gpu_name() or "gpu") if a.device == "gpu" else "cpu")  # (once: nvidia-smi names the GPU)
    a.model = a.model or str(fetch(cache_dir(), "coder-1.5b"))
    needs_draft = "draft" in a.arms.split(",") or (a.llama_server and "draft" in a.llama_arms.split(","))
    a.draft = a.draft or (str(fetch(cache_dir(), "coder-0.5b")) if needs_draft else "")
    cases = {name: case for name, case in workloads(source_file()).items() if name in a.workloads.split(",")}
    port = free_port()
    result, logs = {}, Path(tempfile.mkdtemp(prefix="speculation_bench_"))
    for arm, cmd in arms(a, port, [f for f in extra if f != "--"]).items():
        try:
            result[arm] = run_arm(cmd, f"http://127.0.0.1:{port}", cases, a, logs / (arm.replace(" ", "_") + ".log"))
        except (RuntimeError, TimeoutError, httpx.HTTPError) as e:
            print(f"{arm}: FAILED: {e}", flush=True)
            result[arm] = {"error": str(e).splitlines()[0]}
            continue
        compare(result)
        for name, row in result[arm].items():
            print(f"{arm:13s} {name:9s} {row['tokens']:4d} tokens  {row['decode_tok_s']:7.2f} tok/s  drafted "
                  f"{row['drafted']:4d} accepted {row['accepted']:4d}  against off {row.get('vs_off')}  same text "
                  f"{row.get('same_text')}" + (f"  aggregate {row['aggregate_tok_s']} tok/s, against off "
                                               f"{row.get('aggregate_vs_off')}" if "aggregate_tok_s" in row else ""),
                  flush=True)
        save(a, result)
        if a.show_text:
            for name, row in result[arm].items():
                print(f"{arm} {name}: {row['text'][:600]!r}", flush=True)
    print(f"logs: {logs}")
    return 0 if compare(result) and not any("error" in rows for rows in result.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
