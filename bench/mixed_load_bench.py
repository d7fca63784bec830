"""The mixed case through the HTTP server: a long read (A) while clients decode, and a short
request (B) arriving during the read.

    STRATA_MODEL=... python bench/mixed_load_bench.py [--device gpu] [--a-tokens 46832] [--decoders 4]
        [--b-delay 2] [--chunk 2048] [--repeats 2] [--json FILE]

One server (the real engine, --slots decoders + 2, no prompt reuse so that every read is cold):
first B alone and A alone (their solo times), then per repeat: the decoders start streaming long
answers, A is sent, B `--b-delay` s after A. Reported (medians of repeats): B's first token after
it arrives and B's whole time against its solo time; the decoders' time between tokens while A
reads (p50, p99, max); A's wall against A alone, and against A alone plus the others' service
during its read (the decode steps it waited for, timings.shared_ms, and its time parked for B).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from pathlib import Path

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.prefill_preempt_bench import long_prompt, send_a, send_b  # noqa: E402
from bench.sse_client import shared_client  # noqa: E402
from tests.harness import ServerProcess  # noqa: E402


def story_body(i: int, max_tokens: int) -> dict:
    """Decoder i's streamed chat request: a long answer of its own (seeded by i)."""
    return {"messages": [{"role": "user", "content": f"Tell a long story number {i}."}], "max_tokens": max_tokens,
            "temperature": 0.7, "seed": i, "stream": True}


def decode_stream(url: str, i: int, max_tokens: int, stamps: list[float], stop: threading.Event) -> None:
    body = story_body(i, max_tokens)
    with shared_client().stream("POST", f"{url}/v1/chat/completions", json=body, timeout=600) as r:
        for line in r.iter_lines():
            if line.startswith("data: {") and '"content"' in line:
                stamps.append(time.monotonic())
            if stop.is_set():
                return


def one_run(url: str, prompt: list[int], a: argparse.Namespace) -> dict:
    stop = threading.Event()
    stamps = [[] for _ in range(a.decoders)]
    decoders = [threading.Thread(target=decode_stream, args=(url, i, a.decode_tokens, stamps[i], stop))
                for i in range(a.decoders)]
    for t in decoders:
        t.start()
    while min(len(s) for s in stamps) < 3:  # all decoding
        time.sleep(0.01)
    a_out: dict = {}
    reader = threading.Thread(target=send_a, args=(url, prompt, 4, a_out))
    reader.start()
    time.sleep(a.b_delay)
    b = send_b(url, 16)
    reader.join()
    stop.set()
    for t in decoders:
        t.join()
    read_from, read_to = a_out["sent"], a_out["sent"] + a_out["timings"]["prompt_ms"] / 1000
    gaps = [t1 - t0 for times in stamps for t0, t1 in zip(times, times[1:]) if read_from <= t0 and t1 <= read_to + 0.5]
    others_s = (a_out["timings"]["shared_ms"] + a_out["timings"]["parked_ms"]) / 1000  # the others' service in A's time
    return {"a_wall_s": a_out["done"] - a_out["sent"], "a_others_s": others_s, "b_ttft_s": b["first"] - b["sent"],
            "b_done_s": b["done"] - b["sent"], "gap_p50_ms": float(np.percentile(gaps, 50) * 1000),
            "gap_p99_ms": float(np.percentile(gaps, 99) * 1000), "gap_max_ms": float(max(gaps) * 1000),
            "gaps": len(gaps)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="gpu")
    p.add_argument("--a-tokens", type=int, default=46832)
    p.add_argument("--decoders", type=int, default=4)
    p.add_argument("--decode-tokens", type=int, default=4000)
    p.add_argument("--b-delay", type=float, default=2.0)
    p.add_argument("--chunk", type=int, default=2048)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--json")
    a = p.parse_args()
    extra = ["--device", a.device, "--chunk", str(a.chunk), "--slots", str(a.decoders + 2), "--no-prompt-reuse",
             "--ctx", str((a.a_tokens + 1024) // 256 * 256)]
    prompt = long_prompt(a.a_tokens)
    with ServerProcess(extra=extra, keepalive_s=5).start(timeout_s=600) as server:
        send_b(server.url, 16)  # warm-up (graphs)
        solo = [send_b(server.url, 16) for _ in range(3)]
        b_alone = statistics.median(s["done"] - s["sent"] for s in solo)
        a_out: dict = {}
        send_a(server.url, prompt, 4, a_out)
        a_alone = a_out["done"] - a_out["sent"]
        runs = []
        for i in range(a.repeats):
            runs.append(one_run(server.url, prompt, a))
            print(f"run {i + 1}: " + json.dumps({k: round(v, 3) for k, v in runs[-1].items()}), flush=True)
        info = httpx.get(server.url + "/status").json()["engine_info"]
    med = {k: round(statistics.median(r[k] for r in runs), 3) for k in runs[0]}
    result = {"engine": info, "a_tokens": a.a_tokens, "decoders": a.decoders, "b_delay_s": a.b_delay,
              "b_alone_s": round(b_alone, 3), "a_alone_s": round(a_alone, 3), "median": med, "runs": runs,
              "b_done_over_alone_s": round(med["b_done_s"] - b_alone, 3),
              "a_wall_over_alone": round(med["a_wall_s"] / a_alone, 3),
              "a_wall_over_alone_plus_others": round(med["a_wall_s"] / (a_alone + med["a_others_s"]), 3)}
    print(json.dumps({k: v for k, v in result.items() if k not in ("runs", "engine")}))
    if a.json:
        Path(a.json).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
