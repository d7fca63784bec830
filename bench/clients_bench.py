"""N concurrent streaming clients against the server as a user starts it (issue 42).

    python bench/clients_bench.py [--model FILE] [--server-arg "--device gpu"] [--log FILE]
        [--clients 1,16,64,128,256] [--words 300] [--max-tokens 256] [--seed 0] [--solo 8] [--json FILE]
    python bench/clients_bench.py --url http://127.0.0.1:8080 [--log THE_SERVER'S_LOG] [...]

Without --url the bench starts `python -m serve [--model FILE] --port P [server args]` with the
server's defaults (its output to --log), waits for /health and stops it at the end (SIGINT, then
kill). Then one phase per --clients count, in that order, on the same server: all N clients
start at once (one thread and one connection each) and stream /v1/chat/completions greedily
(temperature 0, --max-tokens each). Client i's prompt is a distinct ~--words-word text made from
numpy's default_rng(seed + i), so client i sends the same prompt in every phase (and later phases
find the earlier phases' prompts in the prefix cache, as a real server would).

Per phase (docs/DESIGN.md's words): TTFT = the client's send to its first streamed content chunk
(p50/p95/max); the gap = time between consecutive content chunks of one stream, pooled over the
clients (p50/p99/max; a chunk is normally one token); aggregate tokens/s = all completion tokens
/ (last end - first start); wall; failures (non-200, transport errors, error events, streams
without a finish). Engine restarts: lines of the server's log that say the engine died or was
restarted, read per phase (only with a log), and the server's strata_engine_restarts counter.

Exactness (greedy must not depend on the batch): the same client index is compared across phases,
and --solo K clients of the largest phase (evenly spaced indices) are sent again alone, one at a
time, and compared with what they got under load.

Exit status 1 if any request failed, any text differed or any engine restart was seen.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.server_health import FAILED, READY, server_health  # noqa: E402
from bench.sse_client import StreamRefused, stream_chunks  # noqa: E402
from engine.core.parent_death import die_with_parent  # noqa: E402

PATH = "/v1/chat/completions"
# serve/engine_proc/engine_client.py's log lines when an engine dies and is started again
RESTART_MARKS = ("engine exited unexpectedly", "restarting", "engine start failed")
CAPTURE_MARK = "captured the decode step"  # engine/runner/decode_graph.py: a CUDA graph made while serving
ERROR_MARKS = ("Error", "Traceback", "ERR")  # "ERR" also catches the log's ERROR level

# The prompts' vocabulary: plain words, so that every prompt reads as (odd) prose of similar length in tokens.
WORDS = """the of and to in is was for on that with as by at from his her their its an be this which or had
are were but not have has all one two new first after other more some time year people city river house
water light night morning road village garden market school church king queen army ship island mountain
forest valley bridge tower wall door window table letter book story song voice name family father mother
brother sister friend child teacher doctor farmer soldier sailor merchant painter writer old young small
large long short high low early late quiet loud warm cold bright dark green blue red white black golden
heavy gentle sudden slow quick strange simple ancient distant walked turned looked found gave took made
came went saw heard told asked wrote built opened closed carried followed remembered waited crossed left
returned began kept brought held stood fell rose listened answered watched during before under over
between through across along behind beyond near toward without against because while although when where
never always often again still already only soon perhaps slowly quietly together alone almost every each
many few several another nothing something everything someone harbor winter summer autumn spring storm
rain snow wind fire stone iron wood glass paper bread wine salt silver coin horse dog bird fish field hill
lake sea shore sky cloud star moon sun road path gate lamp candle clock bell map journey promise secret""".split()


@dataclass
class ClientResult:
    """What one streaming client saw; times are time.monotonic() on this machine."""

    index: int
    start: float = 0.0  # just before the request was sent (the client's arrival)
    end: float = 0.0
    stamps: list[float] = field(default_factory=list)  # arrival of each content chunk
    parts: list[str] = field(default_factory=list)
    usage_tokens: int | None = None
    prompt_tokens: int | None = None
    finish: str | None = None
    restarts: int = 0  # the request's own timings.engine_restarts
    error: str | None = None

    @property
    def text(self) -> str:
        return "".join(self.parts)

    @property
    def tokens(self) -> int:
        return self.usage_tokens if self.usage_tokens is not None else len(self.stamps)

    @property
    def ttft(self) -> float | None:
        return self.stamps[0] - self.start if self.stamps else None


# ---------------------------------------------------------------- prompts and clients

def prompt_text(seed: int, index: int, words: int) -> str:
    """Client `index`'s prompt: `words` words drawn with default_rng(seed + index), cut into sentences."""
    rng = np.random.default_rng(seed + index)
    picked = [WORDS[k] for k in rng.integers(len(WORDS), size=words)]
    sentences, at = [], 0
    while at < len(picked):
        n = int(rng.integers(6, 16))
        s = " ".join(picked[at:at + n])
        sentences.append(s[0].upper() + s[1:] + ".")
        at += n
    return "Continue this text in the same style, for as long as you can:\n\n" + " ".join(sentences)


def request_body(prompt: str, max_tokens: int) -> dict:
    # include_usage: serve/api/openai_schema.py StreamOptions; the last chunk then carries the token counts
    return {"messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}}


def read_event(event: dict, now: float, r: ClientResult) -> None:
    """Fold one streamed event into the client's result."""
    if "error" in event:  # serve/http/routes.py stream_events: a failure after the 200
        r.error = f"error event: {json.dumps(event['error'])[:300]}"
        return
    for choice in event.get("choices") or []:
        delta = choice.get("delta") or {}
        # a thinking model streams reasoning_content first; both are generated tokens
        piece = (delta.get("reasoning_content") or "") + (delta.get("content") or "")
        if piece:
            r.stamps.append(now)
            r.parts.append(piece)
        if choice.get("finish_reason"):
            r.finish = choice["finish_reason"]
    if event.get("usage"):
        r.usage_tokens = event["usage"].get("completion_tokens")
        r.prompt_tokens = event["usage"].get("prompt_tokens")
    if "timings" in event:
        r.restarts = int(event["timings"].get("engine_restarts", 0) or 0)


def run_client(url: str, body: dict, r: ClientResult, go: threading.Barrier, timeout: float) -> None:
    go.wait()  # every client of the phase is ready: they send together
    r.start = time.monotonic()
    try:
        for event in stream_chunks(url, PATH, body, timeout):
            read_event(event, time.monotonic(), r)
            if r.error:
                break
    except (StreamRefused, httpx.HTTPError, ValueError) as e:
        r.error = f"{type(e).__name__}: {e}"
    r.end = time.monotonic()
    if r.error is None and r.finish is None:
        r.error = "the stream ended without a finish_reason"


def run_clients(url: str, bodies: dict[int, dict], timeout: float) -> list[ClientResult]:
    """All of `bodies` at once, one thread (and so one connection) each; returns when all are done."""
    results = [ClientResult(i) for i in bodies]
    go = threading.Barrier(len(results))
    # daemon: a Ctrl+C of the bench must not wait for streams that the server's stop will end anyway
    threads = [threading.Thread(target=run_client, args=(url, bodies[r.index], r, go, timeout), daemon=True)
               for r in results]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


# ---------------------------------------------------------------- figures

def pct(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


def summarize(n: int, results: list[ClientResult]) -> dict:
    ttfts = [r.ttft for r in results if r.ttft is not None]
    gaps = [b - a for r in results for a, b in zip(r.stamps, r.stamps[1:])]
    failed = [r for r in results if r.error]
    span = max(r.end for r in results) - min(r.start for r in results)
    tokens = sum(r.tokens for r in results)
    prompts = [r.prompt_tokens for r in results if r.prompt_tokens is not None]
    ms = lambda v: None if v is None else round(v * 1000, 2)  # noqa: E731
    s3 = lambda v: None if v is None else round(v, 3)  # noqa: E731
    return {
        "clients": n, "failures": len(failed), "first_failure": failed[0].error if failed else None,
        "ttft_s": {"p50": s3(pct(ttfts, 50)), "p95": s3(pct(ttfts, 95)), "max": s3(max(ttfts, default=None))},
        "gap_ms": {"p50": ms(pct(gaps, 50)), "p99": ms(pct(gaps, 99)), "max": ms(max(gaps, default=None)),
                   "gaps": len(gaps)},
        "completion_tokens": tokens, "content_chunks": sum(len(r.stamps) for r in results),
        "prompt_tokens_mean": round(float(np.mean(prompts)), 1) if prompts else None,
        "tokens_per_s": round(tokens / span, 2) if span > 0 else None, "wall_s": round(span, 3),
        "restarts_one_request_saw": max((r.restarts for r in results), default=0),  # the most one request lived through
        "clients_detail": [{"index": r.index, "ttft_s": s3(r.ttft), "tokens": r.tokens, "chunks": len(r.stamps),
                            "finish": r.finish, "error": r.error} for r in results],
    }


def first_difference(a: str, b: str) -> int | None:
    """The first character position where a and b differ (the shorter's length if one is the other's
    start); None when equal."""
    if a == b:
        return None
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def compare(label: str, index: int, got: str, want: str, out: list[dict]) -> None:
    """Record a comparison of client `index`'s texts; a mismatch is printed with where it starts."""
    pos = first_difference(got, want)
    out.append({"what": label, "index": index, "equal": pos is None, "first_difference": pos})
    if pos is not None:
        print(f"MISMATCH {label}, client {index}: first difference at char {pos}: "
              f"{got[max(0, pos - 20):pos + 40]!r} vs {want[max(0, pos - 20):pos + 40]!r}", flush=True)


def cross_phase_checks(phases: list[tuple[str, dict[int, ClientResult]]]) -> list[dict]:
    """Client i sends the same prompt in every phase: each phase's text is compared with the text of
    the first phase (in run order) where client i answered."""
    out: list[dict] = []
    reference: dict[int, tuple[str, str]] = {}
    for label, results in phases:
        for i, r in results.items():
            if r.error:
                continue
            if i in reference:
                compare(f"{label} vs {reference[i][0]}", i, r.text, reference[i][1], out)
            else:
                reference[i] = (label, r.text)
    return out


def solo_indices(n: int, k: int) -> list[int]:
    """k client indices spread evenly over 0..n-1 (both ends included)."""
    return sorted({int(round(x)) for x in np.linspace(0, n - 1, min(k, n))}) if k > 0 and n > 0 else []


# ---------------------------------------------------------------- the server and its log

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def log_tail(path: Path | None, lines: int = 40) -> str:
    if path is None or not path.exists():
        return "(no log)"
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def start_server(cmd: list[str], log_path: Path) -> subprocess.Popen:
    print(f"starting: {shlex.join(cmd)}  (log: {log_path})", flush=True)
    with open(log_path, "wb") as log:
        # its own session: a Ctrl+C of the bench reaches the server only through stop_server's SIGINT;
        # die_with_parent: a bench killed outright does not leave it running
        return subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                preexec_fn=die_with_parent)


def wait_healthy(proc: subprocess.Popen | None, url: str, log_path: Path | None, timeout_s: float) -> None:
    """Poll /health until 200, printing progress; fail at once if the server process has ended or its engine
    could not be started."""
    t0 = last_print = time.monotonic()
    state = "no answer"
    while time.monotonic() - t0 < timeout_s:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode} while starting; its log's end:\n"
                               f"{log_tail(log_path)}")
        health, state = server_health(url)
        if health == READY:
            print(f"server ready after {time.monotonic() - t0:.1f} s", flush=True)
            return
        if health == FAILED:  # its engine could not be started: waiting longer will not help
            raise RuntimeError(f"the server's engine failed to start: {state}; its log's end:\n{log_tail(log_path)}")
        if time.monotonic() - last_print >= 5:
            print(f"  waiting for {url}/health: {time.monotonic() - t0:.0f} s, {state}", flush=True)
            last_print = time.monotonic()
        time.sleep(0.2)
    raise TimeoutError(f"{url}/health not 200 within {timeout_s:.0f} s ({state}); log's end:\n{log_tail(log_path)}")


def child_pids(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def stop_server(proc: subprocess.Popen) -> None:
    """SIGINT (the server answers what runs, then QUITs its engines); what is left after 30 s is
    killed. The engines run in sessions of their own, so they are waited for (and killed) by pid."""
    engines = child_pids(proc.pid) if proc.poll() is None else []
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            print("the server did not stop within 30 s of SIGINT: killing it", flush=True)
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + 10
    for pid in engines:
        while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        if Path(f"/proc/{pid}").exists():
            print(f"engine {pid} still running after the server stopped: killing it", flush=True)
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


class LogWatch:
    """Reads what a log file gained since the last read, so that each phase gets its own lines."""

    def __init__(self, path: Path | None, from_start: bool):
        self.path = path
        self.offset = 0 if from_start or path is None or not path.exists() else path.stat().st_size

    def take(self) -> dict | None:
        if self.path is None or not self.path.exists():
            return None
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            data = f.read()
        self.offset += len(data)
        return scan_log(data.decode("utf-8", "replace").splitlines())


def scan_log(lines: list[str]) -> dict:
    errors = [ln for ln in lines if any(m in ln for m in ERROR_MARKS)]
    return {"restart_lines": sum(any(m in ln for m in RESTART_MARKS) for ln in lines),
            "captures": sum(CAPTURE_MARK in ln for ln in lines), "error_lines": len(errors),
            "errors": errors[:50]}


def metrics_restarts(url: str) -> float | None:
    """The server's strata_engine_restarts counter (prometheus adds _total); None if unreadable."""
    try:
        text = httpx.get(url + "/metrics", timeout=10).text
    except httpx.HTTPError:
        return None
    for line in text.splitlines():
        if line.startswith("strata_engine_restarts_total "):
            return float(line.split()[1])
    return None


def engine_info(url: str) -> dict | None:
    try:
        return httpx.get(url + "/status", timeout=10).json().get("engine_info")
    except (httpx.HTTPError, ValueError):
        return None


def machine() -> dict:
    cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                if ln.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").exists() else \
        platform.processor()
    info = {"platform": platform.platform(), "cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version()}
    try:
        gpus = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                              text=True, timeout=20).stdout.split("\n")
        info["gpus"] = [g.strip() for g in gpus if g.strip()]
    except (OSError, subprocess.TimeoutExpired):
        info["gpus"] = []
    return info


# ---------------------------------------------------------------- report

def log_line(segment: str, seg: dict | None, restarts_delta: float | None) -> None:
    """Print a segment's engine events and error lines as they are read."""
    if seg is None and restarts_delta is None:
        return
    parts = [f"restarts (metrics) {restarts_delta if restarts_delta is not None else '-'}"]
    if seg is not None:
        parts += [f"restart lines {seg['restart_lines']}", f"captures {seg['captures']}",
                  f"error lines {seg['error_lines']}"]
    print(f"  [{segment}] " + ", ".join(parts), flush=True)
    for ln in (seg or {}).get("errors", [])[:20]:
        print(f"    {ln}", flush=True)


def fmt(v, nd: int = 2) -> str:
    return "-" if v is None else f"{v:.{nd}f}"


def print_table(phases: list[dict]) -> None:
    head = (f"{'clients':>7} {'ok':>5} {'fail':>4} {'TTFT p50/p95/max s':>20} {'gap p50/p99/max ms':>22} "
            f"{'tok/s':>8} {'wall s':>7} {'restarts':>8} {'captures':>8} {'err lines':>9} {'bench cpu':>9}")
    print(head)
    print("-" * len(head))
    for p in phases:
        t, g, log = p["ttft_s"], p["gap_ms"], p.get("log") or {}
        restarts = max(log.get("restart_lines", 0), int(p.get("metrics_restarts") or 0), p["restarts_one_request_saw"])
        print(f"{p['clients']:>7} {p['clients'] - p['failures']:>5} {p['failures']:>4} "
              f"{fmt(t['p50']) + '/' + fmt(t['p95']) + '/' + fmt(t['max']):>20} "
              f"{fmt(g['p50'], 1) + '/' + fmt(g['p99'], 1) + '/' + fmt(g['max'], 1):>22} "
              f"{fmt(p['tokens_per_s'], 1):>8} {fmt(p['wall_s'], 1):>7} {restarts:>8} "
              f"{log.get('captures', '-'):>8} {log.get('error_lines', '-'):>9} {fmt(p.get('bench_cpu_share')):>9}")


# ---------------------------------------------------------------- main

def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", help="an already running server (else the bench starts one)")
    p.add_argument("--model", help="GGUF file for the server it starts (default: the server's default model)")
    p.add_argument("--server-arg", action="append", default=[],
                   help='more flags for the server it starts, split like a shell: --server-arg "--device gpu"')
    p.add_argument("--port", type=int, help="the started server's port (default: a free one)")
    p.add_argument("--log", help="the started server's log (default: a file in the temporary folder); with --url, "
                                 "the running server's log to read engine restarts and errors from")
    p.add_argument("--start-timeout", type=float, default=900.0, help="seconds to wait for /health")
    p.add_argument("--clients", default="1,16,64,128,256", help="one phase per count, in this order")
    p.add_argument("--words", type=int, default=300, help="words in each client's prompt")
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--seed", type=int, default=0, help="client i's prompt comes from default_rng(seed + i)")
    p.add_argument("--solo", type=int, default=8, help="clients of the largest phase sent again alone and compared")
    p.add_argument("--timeout", type=float, default=600.0, help="httpx timeout per read (s)")
    p.add_argument("--json", help="write every figure here")
    a = p.parse_args()
    a.counts = [int(c) for c in a.clients.split(",") if c.strip()]
    if not a.counts or min(a.counts) < 1:
        p.error("--clients needs positive counts")
    if a.url and (a.model or a.server_arg or a.port):
        p.error("--url runs against a server already started: --model, --server-arg and --port are for one the "
                "bench starts")
    return a


def server_command(a: argparse.Namespace, port: int) -> list[str]:
    cmd = [sys.executable, "-m", "serve"] + (["--model", a.model] if a.model else []) + ["--port", str(port)]
    return cmd + [x for arg in a.server_arg for x in shlex.split(arg)]


def phase_label(n: int, taken: list[str]) -> str:
    """"16 clients"; a count given twice in --clients gets "(#2)" for its second phase."""
    label = f"{n} clients"
    return label if label not in taken else f"{label} (#{sum(t.startswith(label) for t in taken) + 1})"


def run_phases(url: str, a: argparse.Namespace, prompts: dict[int, str], watch: LogWatch, report: dict,
               texts: list[tuple[str, dict[int, ClientResult]]]) -> None:
    """Each phase, then the solo runs; figures go into `report`, each phase's results into `texts`."""
    for n in a.counts:
        before = metrics_restarts(url)
        print(f"phase: {n} clients ...", flush=True)
        cpu = time.process_time()
        results = run_clients(url, {i: request_body(prompts[i], a.max_tokens) for i in range(n)}, a.timeout)
        cpu = time.process_time() - cpu
        after = metrics_restarts(url)
        summary = summarize(n, results)
        # the clients' threads share one interpreter lock: near 1.0 the bench itself was busy all along
        # and may have stamped chunks late (the gaps would then be partly the client's)
        summary["bench_cpu_share"] = round(cpu / summary["wall_s"], 3) if summary["wall_s"] > 0 else None
        summary["metrics_restarts"] = None if before is None or after is None else after - before
        summary["log"] = watch.take()
        report["phases"].append(summary)
        texts.append((phase_label(n, [t[0] for t in texts]), {r.index: r for r in results}))
        t, g = summary["ttft_s"], summary["gap_ms"]
        print(f"  {n} clients: {summary['failures']} failed, TTFT p50 {fmt(t['p50'])} s, gap p99 {fmt(g['p99'], 1)} "
              f"ms, {fmt(summary['tokens_per_s'], 1)} tok/s, wall {fmt(summary['wall_s'], 1)} s"
              + (f"; first failure: {summary['first_failure']}" if summary["first_failure"] else ""), flush=True)
        log_line(f"{n} clients", summary["log"], summary["metrics_restarts"])
    largest = max(a.counts)
    before = metrics_restarts(url)
    for i in solo_indices(largest, a.solo):
        print(f"solo: client {i} ...", flush=True)
        r = run_clients(url, {i: request_body(prompts[i], a.max_tokens)}, a.timeout)[0]
        report["solo"].append({"index": i, "error": r.error, "tokens": r.tokens})
        if r.error:
            print(f"  solo client {i} failed: {r.error}", flush=True)
            continue
        for label, got in texts:
            if i in got and not got[i].error:
                compare(f"{label} vs solo", i, got[i].text, r.text, report["checks"])
    after = metrics_restarts(url)
    report["solo_log"] = watch.take()
    report["solo_metrics_restarts"] = None if before is None or after is None else after - before
    log_line("solo", report["solo_log"], report["solo_metrics_restarts"])


def verdict(report: dict) -> tuple[int, int, int]:
    """(failed requests, mismatched texts, engine restarts seen) over the whole run. The restarts are
    seen three ways (log lines, the server's counter, the requests' own timings); one death shows in
    all three, so the largest is taken."""
    failed = sum(p["failures"] for p in report["phases"]) + sum(1 for s in report["solo"] if s["error"])
    mismatched = sum(not c["equal"] for c in report["checks"])
    segments = [p.get("log") for p in report["phases"]] + [report.get("startup_log"), report.get("solo_log")]
    restarts = max(sum(s["restart_lines"] for s in segments if s), int(report.get("metrics_restarts_total") or 0),
                   max((p["restarts_one_request_saw"] for p in report["phases"]), default=0))
    return failed, mismatched, restarts


def main() -> int:
    a = parse_args()
    proc, log_path = None, Path(a.log) if a.log else None
    if a.url:
        url = a.url.rstrip("/")
    else:
        port = a.port or free_port()
        url = f"http://127.0.0.1:{port}"
        log_path = log_path or Path(tempfile.gettempdir()) / f"clients_bench_server_{port}.log"
        proc = start_server(server_command(a, port), log_path)
    report: dict = {"machine": machine(), "url": url, "server_cmd": proc and shlex.join(proc.args),
                    "log": str(log_path) if log_path else None,
                    "args": {k: getattr(a, k) for k in ("counts", "words", "max_tokens", "seed", "solo")},
                    "phases": [], "solo": [], "checks": []}
    texts: list[tuple[str, dict[int, ClientResult]]] = []
    try:
        try:
            wait_healthy(proc, url, log_path, a.start_timeout)
        except (RuntimeError, TimeoutError) as e:
            print(f"clients_bench: {e}", file=sys.stderr)
            return 1
        watch = LogWatch(log_path, from_start=proc is not None)
        report["startup_log"] = watch.take()  # the engine's load: captures and errors before any client
        log_line("start-up", report["startup_log"], None)
        report["engine_info"] = engine_info(url)
        first = metrics_restarts(url)
        prompts = {i: prompt_text(a.seed, i, a.words) for i in range(max(a.counts))}
        run_phases(url, a, prompts, watch, report, texts)
        last = metrics_restarts(url)
        report["metrics_restarts_total"] = None if first is None or last is None else last - first
    finally:
        if proc is not None:
            stop_server(proc)
    report["checks"] = cross_phase_checks(texts) + report["checks"]
    failed, mismatched, restarts = verdict(report)
    report["verdict"] = {"failed_requests": failed, "mismatched_texts": mismatched, "engine_restarts": restarts,
                         "texts_compared": len(report["checks"])}
    print()
    print(f"machine: {report['machine']['gpus'] or report['machine']['cpu']}; {a.words} words, "
          f"max_tokens {a.max_tokens}, greedy")
    print_table(report["phases"])
    print(f"texts compared: {len(report['checks'])} ({sum(c['what'].endswith('solo') for c in report['checks'])} "
          f"against solo runs), mismatched: {mismatched}; failed requests: {failed}; engine restarts: {restarts}")
    if a.json:
        Path(a.json).write_text(json.dumps(report, indent=1) + "\n")
        print(f"wrote {a.json}")
    return 1 if failed or mismatched or restarts else 0


if __name__ == "__main__":
    sys.exit(main())
