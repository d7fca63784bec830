"""The HTTP server's own cost, apart from any model: its CPU time per request and per streamed token, and what its
one event loop then does to a burst's first tokens. The server is started as a user starts it, in front of the mock
engine (engine/mock_engine.py) with no compute at all (reads and decode steps take no time), so every millisecond
measured is the server's: parsing, the chat template and tokenizer, admission, the GEN line, the engine's lines, the
detokenizer and the streamed events.

    python bench/server_cost_bench.py [--model GGUF] [--burst 16] [--system-words 4400] [--tail-words 220]
        [--answer 16] [--streams 64] [--stream-tokens 256] [--cases burst,streams] [--repeats 3] [--pin]
        [--label NAME --json FILE]

Cases, each repeated --repeats times (medians reported beside every run):
- burst: --burst streamed chat requests at once with a shared --system-words system prompt and a --tail-words tail
  each (issue 44's sub-agents: ~5.9K and ~300 tokens with Llama 3's vocabulary), --answer tokens each: the server
  process's CPU ms per request (its user + system time over the burst, its engine excluded), and the first tokens'
  p50 / max as this client sees them (with no compute, the wait a burst's last request has behind the server's own
  work on the others).
- streams: --streams streamed requests at once of --stream-tokens tokens each (short prompts): the server's CPU us
  per streamed token and the tokens a second it delivered (the engine emits as fast as the server takes them).

Without --model the Llama-3-8B chat shape's vocabulary and template on a tiny model are made (as the device steps'
chat model: tools/fixtures/make_synthetic_gguf.py with llama.cpp's Llama 3 vocabulary and the Llama-3.1 template).
The client runs on the same machine: its threads take CPU beside the server's (run it on an idle machine).
"""
from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.engine_bench import machine, merge_result  # noqa: E402
from bench.sse_client import stream_chunks  # noqa: E402
from tests.harness import PY, ROOT, ServerProcess, mock_engine_cmd  # noqa: E402

WORDS = ("alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar papa "
         "quebec romeo sierra tango uniform victor whiskey xray yankee zulu").split()


def cpu_s(pid: int) -> float:
    """The process's CPU seconds, its threads' together (the scheduler's nanoseconds: /proc/PID/stat's ticks are
    10 ms); its children, the engine, not counted. A thread that ended meanwhile is not counted either."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            total += int((task / "schedstat").read_text().split()[0])
    return total / 1e9


def pin(server_pid: int) -> None:
    """The server alone on the first core, its engine and this client on the others (a small machine's figures then
    vary less with the client's own work)."""
    cores = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(server_pid, cores[:1])
    for child in Path(f"/proc/{server_pid}/task/{server_pid}/children").read_text().split():
        os.sched_setaffinity(int(child), cores[1:])
    os.sched_setaffinity(0, cores[1:])


def chat_model(folder: Path) -> Path:
    """A tiny model with Llama 3's vocabulary (128,256 tokens) and the Llama-3.1 chat template."""
    path = folder / "tiny-llama3-chat.gguf"
    fixtures = ROOT / "tests" / "fixtures"
    subprocess.run([PY, str(ROOT / "tools/fixtures/make_synthetic_gguf.py"), str(path), "--preset", "tiny", "--type",
                    "F16", "--tokenizer", str(fixtures / "vocab/ggml-vocab-llama-bpe.gguf"), "--chat-template",
                    str(fixtures / "templates/meta-llama-Llama-3.1-8B-Instruct.jinja")],
                   check=True, capture_output=True)
    return path


def first_token_s(url: str, messages: list[dict], tokens: int) -> tuple[float, int]:
    """(seconds to the first streamed content, content events received)."""
    began, first, events = time.perf_counter(), None, 0
    body = {"model": "any", "messages": messages, "max_tokens": tokens, "temperature": 0, "stream": True}
    for chunk in stream_chunks(url, "/v1/chat/completions", body, timeout=300):
        if chunk.get("choices") and chunk["choices"][0].get("delta", {}).get("content"):
            events += 1
            first = first if first is not None else time.perf_counter() - began
    return (first if first is not None else time.perf_counter() - began), events


def at_once(n: int, work) -> list:
    with concurrent.futures.ThreadPoolExecutor(n) as pool:
        return list(pool.map(work, range(n)))


def burst(server: ServerProcess, a: argparse.Namespace, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    system = " ".join(rng.choice(WORDS, a.system_words))
    tails = [" ".join(rng.choice(WORDS, a.tail_words)) for _ in range(a.burst)]
    first_token_s(server.url, [{"role": "system", "content": system}, {"role": "user", "content": tails[0]}],
                  a.answer)  # the agent: its prompt read first, as before sub-agents
    before = cpu_s(server.proc.pid)
    ttfts = at_once(a.burst, lambda i: first_token_s(
        server.url, [{"role": "system", "content": system}, {"role": "user", "content": tails[i]}], a.answer)[0])
    spent = cpu_s(server.proc.pid) - before
    return {"server_cpu_ms_per_request": round(spent * 1000 / a.burst, 2),
            "ttft_p50_s": round(statistics.median(ttfts), 3),
            "ttft_max_s": round(max(ttfts), 3)}


def streams(server: ServerProcess, a: argparse.Namespace, seed: int) -> dict:
    rng = np.random.default_rng(1000 + seed)
    prompts = [" ".join(rng.choice(WORDS, 40)) for _ in range(a.streams)]
    before, began = cpu_s(server.proc.pid), time.perf_counter()
    got = at_once(a.streams, lambda i: first_token_s(server.url, [{"role": "user", "content": prompts[i]}],
                                                      a.stream_tokens)[1])
    wall, spent = time.perf_counter() - began, cpu_s(server.proc.pid) - before
    events = sum(got)
    return {"server_cpu_us_per_token": round(spent * 1e6 / max(events, 1), 1), "tokens": events,
            "tok_s": round(events / wall, 1)}


CASES = {"burst": burst, "streams": streams}


def medians(runs: list[dict]) -> dict:
    return {k: statistics.median(r[k] for r in runs) for k in runs[0]}


def run(a: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(a.model) if a.model else chat_model(Path(tmp))
        engine = mock_engine_cmd("--shape-free", "--chunk", "2048", "--chunk-s", "0", "--token-s", "0", "--vocab",
                                 str(a.vocab), "--ctx", "32768")
        with ServerProcess(engine_cmd=engine, extra=["--model", str(model)]).start() as server:
            if a.pin:
                pin(server.proc.pid)
            out = {"machine": machine("none"),
                   "server": "python -m serve --model MODEL --engine-cmd '<mock, no compute>'",
                   "cases": {}}
            for name in a.cases.split(","):
                case = CASES[name]
                runs = [case(server, a, seed) for seed in range(a.repeats)]
                out["cases"][name] = {"median": medians(runs), "runs": runs}
                print(f"{name}: {out['cases'][name]['median']}", flush=True)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help="a GGUF whose tokenizer and template the server uses (default: made, see above)")
    p.add_argument("--vocab", type=int, default=128256, help="the mock engine's vocabulary (the model's)")
    p.add_argument("--cases", default="burst,streams")
    p.add_argument("--burst", type=int, default=16)
    p.add_argument("--system-words", type=int, default=4400)
    p.add_argument("--tail-words", type=int, default=220)
    p.add_argument("--answer", type=int, default=16)
    p.add_argument("--streams", type=int, default=64)
    p.add_argument("--stream-tokens", type=int, default=256)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--pin", action="store_true", help="the server on a core of its own (see pin)")
    p.add_argument("--label", default="server cost")
    p.add_argument("--json")
    a = p.parse_args()
    result = run(a)
    if a.json:
        merge_result(Path(a.json), a.label, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
