"""Issue 24 ("defaults chosen by measurement"): which prompt chunk should the GPU engine default to?
For each --chunk, the real server is started as a user starts it (`strata-server --model FILE
--chunk N`, every other flag its default), and measured through HTTP:

  (a) long:     one request of --long-tokens prompt tokens (about 97,000) with max_tokens 1, its wall
                time from send to response; --long-repeats times, each a fresh random prompt so the
                prefix cache (on by default) finds nothing to reuse (cached_tokens is recorded: 0);
  (b) newcomer: while a read of --read-tokens (about 32K, max_tokens 1) is in progress, short streamed
                requests (--short-tokens prompt tokens, max_tokens --short-max-tokens) are sent one
                after another at random moments (a random gap after the previous one ends); each one's
                TTFT (send to the first streamed token) is a sample of how long a newcomer waits behind
                the read. With prefill preemption (the default) it waits for the running chunk to end,
                so a bigger chunk means a longer wait. Reads are repeated until --newcomers samples are
                taken (at most --max-reads reads). The short request alone on the idle server first;
  (c) read rate: prompt tokens / (a)'s wall (and the engine's own prompt_ms rate beside it).

Prompts are random token ids (--token-low..--token-high), sent to /v1/completions as lists of ids, so
the sizes are exact and no tokenizer is needed here.

    python bench/chunk_default_bench.py --model FILE [--chunks 256,512,1024,2048,4096] [--json PATH]
        [--long-tokens 97000] [--long-repeats 2] [--read-tokens 32768] [--newcomers 4]
        [--deadline-s 560] [--server-args "--device gpu"] [--make-tokenizer GGUF]

--make-tokenizer: if --model does not exist, synthesize it first (tools/fixtures/make_synthetic_gguf.py,
--make-preset llama3-8b, --make-type Q4_K_M, that tokenizer), as tools/device/gpu_run.sh does.
--deadline-s: seconds from this script's start after which no new measurement begins (what was
measured is kept; the JSON is rewritten after every step). JSON goes to --json, else $OUT/chunk_default.json.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.engine_bench import machine as engine_machine  # noqa: E402
from bench.server_health import FAILED, READY, server_health  # noqa: E402
from bench.sse_client import StreamRefused, stream_chunks  # noqa: E402

T0 = time.monotonic()
TIMEOUT_S = 900


def elapsed() -> float:
    return time.monotonic() - T0


def log(msg: str) -> None:
    print(f"[{elapsed():6.1f} s] {msg}", flush=True)


# ---------------------------------------------------------------- machine, model, server

def machine() -> str:
    """The machine's CPU and GPU, as bench/engine_bench.py names them."""
    gpu = "none"
    try:
        gpu = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20).stdout.strip().splitlines()[0] or gpu
    except (OSError, subprocess.SubprocessError, IndexError):
        pass
    return engine_machine(gpu)


def synthesize(a: argparse.Namespace) -> None:
    Path(a.model).parent.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, str(ROOT / "tools/fixtures/make_synthetic_gguf.py"), a.model, "--preset", a.make_preset,
           "--type", a.make_type, "--tokenizer", a.make_tokenizer]
    log("synthesizing: " + shlex.join(cmd))
    subprocess.run(cmd, check=True, cwd=ROOT)
    log(f"synthesized {a.model} ({Path(a.model).stat().st_size / 2**30:.2f} GiB)")


def server_command(a: argparse.Namespace, chunk: int) -> list[str]:
    base = shlex.split(a.server_cmd) if a.server_cmd else (
        ["strata-server"] if shutil.which("strata-server") else [sys.executable, "-m", "serve"])
    return base + ["--model", a.model, "--chunk", str(chunk), "--port", str(a.port)] + shlex.split(a.server_args)


class Server:
    """The server in its own process group (so that it and its engine can be stopped together)."""

    def __init__(self, cmd: list[str], log_path: Path, start_limit_s: float):
        self.cmd, self.log_path, self.start_limit_s = cmd, log_path, start_limit_s
        self.url = None
        self.proc = None

    def __enter__(self) -> "Server":
        port = self.cmd[self.cmd.index("--port") + 1]
        self.url = f"http://127.0.0.1:{port}"
        self.log_file = open(self.log_path, "w")
        started = time.monotonic()
        self.proc = subprocess.Popen(self.cmd, cwd=ROOT, stdout=self.log_file, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited ({self.proc.returncode}); log:\n{self.tail()}")
            health, said = server_health(self.url)
            if health == READY:
                break
            if health == FAILED:  # its engine could not be started: waiting will not help
                self.stop()
                raise RuntimeError(f"the server's engine failed to start: {said}; log:\n{self.tail()}")
            if time.monotonic() - started > self.start_limit_s:
                self.stop()
                raise RuntimeError(f"server not healthy after {self.start_limit_s:.0f} s; log:\n{self.tail()}")
            time.sleep(0.1)
        self.start_s = time.monotonic() - started
        return self

    def tail(self, n: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        pgid = os.getpgid(self.proc.pid)
        os.killpg(pgid, signal.SIGINT)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(pgid, signal.SIGKILL)  # the engine too, if it outlived the server
        except ProcessLookupError:
            pass
        self.proc.wait()

    def __exit__(self, *exc) -> None:
        self.stop()
        self.log_file.close()


# ---------------------------------------------------------------- requests

def random_prompt(rng: random.Random, n: int, a: argparse.Namespace) -> list[int]:
    return [rng.randint(a.token_low, a.token_high) for _ in range(n)]


def read(url: str, prompt: list[int], out: dict) -> None:
    """One non-streamed /v1/completions request, max_tokens 1: its wall time and what the server says."""
    out["sent"] = time.monotonic()
    try:
        r = httpx.post(f"{url}/v1/completions", json={"prompt": prompt, "max_tokens": 1, "temperature": 0},
                       timeout=TIMEOUT_S)
        out["done"] = time.monotonic()
        body = r.json()
        out["status"] = r.status_code
        out["timings"] = body.get("timings") or {}
        out["usage"] = body.get("usage") or {}
        if r.status_code != 200:
            out["error"] = json.dumps(body)[:300]
    except (httpx.HTTPError, ValueError) as e:
        out["done"], out["error"] = time.monotonic(), f"{type(e).__name__}: {e}"


def short(url: str, prompt: list[int], max_tokens: int) -> dict:
    """One streamed /v1/completions request: send, first streamed piece, done; the server's timings."""
    out = {"sent": time.monotonic(), "first": None, "timings": {}, "error": None}
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True}
    try:
        for chunk in stream_chunks(url, "/v1/completions", body, TIMEOUT_S):
            choices = chunk.get("choices") or []
            if out["first"] is None and choices and choices[0].get("text"):
                out["first"] = time.monotonic()
            out["timings"] = chunk.get("timings") or out["timings"]
    except StreamRefused as e:
        out["error"] = str(e)
    except (httpx.HTTPError, ValueError) as e:
        out["error"] = f"{type(e).__name__}: {e}"
    out["done"] = time.monotonic()
    return out


def ttft_s(s: dict) -> float | None:
    """Client-side TTFT; the server's ttft_ms if no streamed piece carried text (a token that
    decodes to nothing)."""
    if s["first"] is not None:
        return s["first"] - s["sent"]
    ms = s["timings"].get("ttft_ms")
    return None if ms is None else ms / 1000


def r3(x):
    return None if x is None else round(x, 4)


# ---------------------------------------------------------------- the measurements

def newcomer_case(url: str, rng: random.Random, a: argparse.Namespace, deadline: float) -> dict:
    alone = []
    for _ in range(3):
        s = short(url, random_prompt(rng, a.short_tokens, a), a.short_max_tokens)
        alone.append(r3(ttft_s(s)))
    samples, reads = [], []
    for k in range(a.max_reads):
        if len(samples) >= a.newcomers or elapsed() > deadline:
            break
        a_out: dict = {}
        thread = threading.Thread(target=read, args=(url, random_prompt(rng, a.read_tokens, a), a_out))
        thread.start()
        while "sent" not in a_out:
            time.sleep(0.001)
        time.sleep(rng.uniform(a.first_gap_s, 2 * a.first_gap_s))
        mine = []
        while thread.is_alive():
            s = short(url, random_prompt(rng, a.short_tokens, a), a.short_max_tokens)
            if "done" in a_out and s["sent"] >= a_out["done"]:
                break  # the read had ended before this one was sent: not a newcomer behind it
            mine.append({"read": k, "sent_into_read_s": r3(s["sent"] - a_out["sent"]), "ttft_s": r3(ttft_s(s)),
                         "server_ttft_ms": s["timings"].get("ttft_ms"),
                         "queue_wait_ms": s["timings"].get("queue_wait_ms"), "error": s["error"]})
            time.sleep(rng.uniform(a.gap_low_s, a.gap_high_s))
        thread.join()
        read_done = a_out.get("done", time.monotonic())
        for m in mine:  # did the read finish before this newcomer's first token?
            m["read_done_s"] = r3(read_done - a_out["sent"])
        samples += mine
        reads.append({"wall_s": r3(read_done - a_out["sent"]), "prompt_ms": a_out.get("timings", {}).get("prompt_ms"),
                      "parks": a_out.get("timings", {}).get("parks"),
                      "parked_ms": a_out.get("timings", {}).get("parked_ms"),
                      "cached_tokens": (a_out.get("usage", {}).get("prompt_tokens_details") or {}).get("cached_tokens"),
                      "newcomers": len(mine), "error": a_out.get("error")})
        log(f"  read {k + 1}: {reads[-1]} newcomer TTFTs {[m['ttft_s'] for m in mine]}")
    ttfts = [m["ttft_s"] for m in samples if m["ttft_s"] is not None and not m["error"]]
    return {"alone_ttft_s": alone, "alone_ttft_median_s": r3(statistics.median([x for x in alone if x is not None]))
            if any(x is not None for x in alone) else None,
            "reads": reads, "samples": samples, "n": len(ttfts),
            "ttft_median_s": r3(statistics.median(ttfts)) if ttfts else None,
            "ttft_max_s": r3(max(ttfts)) if ttfts else None, "ttft_min_s": r3(min(ttfts)) if ttfts else None}


def long_case(url: str, rng: random.Random, a: argparse.Namespace, deadline: float) -> dict:
    runs = []
    for i in range(a.long_repeats):
        last = runs[-1]["wall_s"] if runs else 0
        if i > 0 and elapsed() + last > deadline:
            log(f"  long: repeat {i + 1} skipped (deadline)")
            break
        out: dict = {}
        read(url, random_prompt(rng, a.long_tokens, a), out)
        usage = out.get("usage", {})
        runs.append({"wall_s": r3(out["done"] - out["sent"]), "prompt_tokens": usage.get("prompt_tokens"),
                     "cached_tokens": (usage.get("prompt_tokens_details") or {}).get("cached_tokens"),
                     "prompt_ms": out.get("timings", {}).get("prompt_ms"),
                     "decode_ms": out.get("timings", {}).get("decode_ms"), "error": out.get("error")})
        log(f"  long {i + 1}: {runs[-1]}")
    good = [r for r in runs if not r["error"] and r["wall_s"] is not None]
    if not good:
        return {"runs": runs}
    wall = statistics.median(r["wall_s"] for r in good)
    tokens = good[0]["prompt_tokens"] or a.long_tokens
    prompt_ms = [r["prompt_ms"] for r in good if r["prompt_ms"]]
    return {"runs": runs, "n": len(good), "wall_median_s": r3(wall), "wall_min_s": r3(min(r["wall_s"] for r in good)),
            "wall_max_s": r3(max(r["wall_s"] for r in good)), "prompt_tokens": tokens,
            "read_tok_s": round(tokens / wall), "engine_prompt_tok_s":
                round(tokens / (statistics.median(prompt_ms) / 1000)) if prompt_ms else None}


def warm_up(url: str, rng: random.Random, a: argparse.Namespace, chunk: int) -> float:
    """Kernels compiled and graphs captured before anything is timed: a read of a few chunks, a
    short streamed request."""
    started = time.monotonic()
    out: dict = {}
    read(url, random_prompt(rng, max(2 * chunk + 100, 1000), a), out)
    short(url, random_prompt(rng, a.short_tokens, a), a.short_max_tokens)
    if out.get("error"):
        raise RuntimeError(f"warm-up read failed: {out['error']}")
    return time.monotonic() - started


def write(path: Path, result: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1) + "\n")


def table(result: dict) -> str:
    rows = [f"{'chunk':>6} | {'long s (median; runs)':>26} | {'read tok/s':>10} | {'engine tok/s':>12} | "
            f"{'newcomer TTFT med / max (n)':>28} | {'alone':>6} | start s",
            "-" * 112]
    for c in result["chunks"]:
        lg, nc = c.get("long") or {}, c.get("newcomer") or {}
        runs = ", ".join(f"{r['wall_s']:.2f}" for r in lg.get("runs", []) if r.get("wall_s") is not None)
        long_s = f"{lg['wall_median_s']:.2f} ({runs})" if lg.get("wall_median_s") is not None else "-"
        new = (f"{nc['ttft_median_s']:.3f} / {nc['ttft_max_s']:.3f} ({nc['n']})"
               if nc.get("ttft_median_s") is not None else "-")
        alone = f"{nc['alone_ttft_median_s']:.3f}" if nc.get("alone_ttft_median_s") is not None else "-"
        rows.append(f"{c['chunk']:>6} | {long_s:>26} | {lg.get('read_tok_s', '-')!s:>10} | "
                    f"{lg.get('engine_prompt_tok_s', '-')!s:>12} | {new:>28} | {alone:>6} | "
                    f"{c.get('server_start_s', '-')}" + (f"  ERROR {c['error'][:80]}" if c.get("error") else ""))
    return "\n".join(rows)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=os.environ.get("STRATA_MODEL"), required="STRATA_MODEL" not in os.environ)
    p.add_argument("--chunks", default="256,512,1024,2048,4096")
    p.add_argument("--long-tokens", type=int, default=97000)
    p.add_argument("--long-repeats", type=int, default=2)
    p.add_argument("--read-tokens", type=int, default=32768)
    p.add_argument("--newcomers", type=int, default=4, help="newcomer samples wanted per chunk")
    p.add_argument("--max-reads", type=int, default=3, help="reads of --read-tokens at most per chunk")
    p.add_argument("--short-tokens", type=int, default=50)
    p.add_argument("--short-max-tokens", type=int, default=16)
    p.add_argument("--first-gap-s", type=float, default=0.3, help="a read's first newcomer: 1-2x this after it")
    p.add_argument("--gap-low-s", type=float, default=0.15, help="the random gap after a newcomer ends")
    p.add_argument("--gap-high-s", type=float, default=0.6)
    p.add_argument("--token-low", type=int, default=1000)
    p.add_argument("--token-high", type=int, default=30000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--port", type=int, default=8080)
    p.add_argument("--server-cmd", default=None, help="default: strata-server if on PATH, else python -m serve")
    p.add_argument("--server-args", default="", help="more server flags (none: defaults as a user starts it)")
    p.add_argument("--start-limit-s", type=float, default=300)
    p.add_argument("--deadline-s", type=float, default=None)
    p.add_argument("--order", choices=("newcomer-first", "long-first"), default="newcomer-first")
    p.add_argument("--json", default=None)
    p.add_argument("--make-tokenizer", help="synthesize --model first if it does not exist, with this tokenizer")
    p.add_argument("--make-preset", default="llama3-8b")
    p.add_argument("--make-type", default="Q4_K_M")
    a = p.parse_args()

    path = Path(a.json) if a.json else Path(os.environ.get("OUT", ".")) / "chunk_default.json"
    deadline = a.deadline_s if a.deadline_s is not None else float("inf")
    if not Path(a.model).exists():
        if not a.make_tokenizer:
            sys.exit(f"no model at {a.model} (give --make-tokenizer to synthesize it)")
        synthesize(a)
    rng = random.Random(a.seed)
    result = {"what": "GPU default chunk (issue 24): a long request's wall time and a newcomer's TTFT per --chunk",
              "machine": machine(), "model": a.model, "model_bytes": Path(a.model).stat().st_size,
              "args": vars(a), "setup_s": round(elapsed(), 1), "chunks": [], "skipped": []}
    log(f"machine {result['machine']}")
    for chunk in [int(x) for x in a.chunks.split(",")]:
        if elapsed() > deadline:
            result["skipped"].append(chunk)
            log(f"chunk {chunk}: skipped (deadline)")
            continue
        cmd = server_command(a, chunk)
        entry: dict = {"chunk": chunk, "server_cmd": shlex.join(cmd)}
        result["chunks"].append(entry)
        log(f"chunk {chunk}: {entry['server_cmd']}")
        try:
            with Server(cmd, Path(f"/tmp/chunk_bench_server_{chunk}.log"), a.start_limit_s) as server:
                entry["server_start_s"] = round(server.start_s, 1)
                entry["engine_info"] = httpx.get(server.url + "/status", timeout=10).json().get("engine_info")
                entry["warm_up_s"] = round(warm_up(server.url, rng, a, chunk), 2)
                log(f"  up after {server.start_s:.1f} s, warm-up {entry['warm_up_s']} s")
                for case in (("newcomer", "long") if a.order == "newcomer-first" else ("long", "newcomer")):
                    if elapsed() > deadline:
                        log(f"  {case}: skipped (deadline)")
                        continue
                    fn = newcomer_case if case == "newcomer" else long_case
                    entry[case] = fn(server.url, rng, a, deadline)
                    write(path, result)
                entry["server_log_tail"] = server.tail(8)
        except Exception as e:  # noqa: BLE001 - one chunk's failure is recorded, the others still run
            entry["error"] = f"{type(e).__name__}: {e}"
            log(f"  FAILED: {entry['error']}")
        write(path, result)
    result["total_s"] = round(elapsed(), 1)
    write(path, result)
    print(table(result), flush=True)
    print(f"JSON: {path}")


if __name__ == "__main__":
    main()
