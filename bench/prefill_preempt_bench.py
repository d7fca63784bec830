"""Head-of-line benchmark through the HTTP server: preemption off vs on, in one run.

A = a long prompt (default ~5,000 tokens) sent to /v1/completions; B = a short chat request sent
`--b-delay` seconds later (streamed, so its first token is seen). For each arm the server is
started fresh with the real engine, and the pair is repeated. Reported (docs/DESIGN.md's words):
B's queue wait (server timings), B's TTFT and completion (client clock, from B's send), A's wall,
A's overhead = A's wall(on) - A's wall(off) - B's own service time (B alone), and the park copy
cost (the snapshot copies, and A's time outside its own compute and its parked interval, on vs
off). Writes JSON and a PNG timeline to bench/results/.

    python bench/prefill_preempt_bench.py [--a-tokens 5000] [--b-delay 3] [--repeats 3] [--chunk 256]
        [--device cpu|gpu] [--ctx N]   (the model: $STRATA_MODEL, else the default)
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

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from engine_bench import machine  # noqa: E402
from sse_client import stream_chunks  # noqa: E402
from tests.harness import ServerProcess  # noqa: E402

B_MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]


def long_prompt(n: int) -> list[int]:
    from engine.modelfile.model_path import resolve_model_path
    from engine.modelfile.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(str(resolve_model_path(None)))  # --model, $STRATA_MODEL or the default
    text = " ".join(f"Record {i}: the committee reviewed item {i * 37 % 1000} and noted its status as "
                    f"{['open', 'closed', 'pending'][i % 3]}." for i in range(n // 10))
    ids = tokenizer.encode(text)
    while len(ids) < n:
        ids += ids
    return ids[:n]


def send_a(url: str, prompt: list[int], max_tokens: int, out: dict) -> None:
    out["sent"] = time.monotonic()
    r = httpx.post(f"{url}/v1/completions", json={"prompt": prompt, "max_tokens": max_tokens, "temperature": 0},
                   timeout=600)
    out["done"] = time.monotonic()
    body = r.json()
    out["timings"], out["status"] = body.get("timings", {}), r.status_code


def send_b(url: str, max_tokens: int) -> dict:
    out = {"sent": time.monotonic(), "first": None, "timings": {}}
    body = {"messages": B_MESSAGES, "max_tokens": max_tokens, "temperature": 0, "stream": True}
    for chunk in stream_chunks(url, "/v1/chat/completions", body, 600):
        if out["first"] is None and chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
            out["first"] = time.monotonic()
        out["timings"] = chunk.get("timings", out["timings"])
    out["done"] = time.monotonic()
    return out


def one_pair(url: str, prompt: list[int], a: argparse.Namespace) -> dict:
    a_out: dict = {}
    thread = threading.Thread(target=send_a, args=(url, prompt, a.a_max_tokens, a_out))
    thread.start()
    time.sleep(a.b_delay)
    b = send_b(url, a.b_max_tokens)
    thread.join()
    t0 = a_out["sent"]
    return {"a_wall_s": a_out["done"] - t0, "a_parks": a_out["timings"].get("parks"),
            "a_parked_ms": a_out["timings"].get("parked_ms"), "a_park_copy_ms": a_out["timings"].get("park_copy_ms"),
            "a_prompt_ms": a_out["timings"].get("prompt_ms"), "a_decode_ms": a_out["timings"].get("decode_ms"),
            "b_sent_s": b["sent"] - t0, "b_queue_wait_ms": b["timings"].get("queue_wait_ms"),
            "b_ttft_s": b["first"] - b["sent"], "b_done_s": b["done"] - b["sent"]}


def run_arm(preempt: bool, prompt: list[int], a: argparse.Namespace) -> dict:
    extra = ["--device", a.device, "--chunk", str(a.chunk)] + ([] if preempt else ["--no-prefill-preempt"])
    extra += ["--ctx", str(a.ctx)] if a.ctx else []
    with ServerProcess(extra=extra, keepalive_s=5) as server:
        send_b(server.url, a.b_max_tokens)  # warm-up
        services = []  # B alone: its own service time
        for _ in range(3):
            b = send_b(server.url, a.b_max_tokens)
            services.append(b["done"] - b["sent"])
        runs = []
        for i in range(a.repeats):
            runs.append(one_pair(server.url, prompt, a))
            print(f"  {'on ' if preempt else 'off'} run {i + 1}: " + json.dumps({k: round(v, 3) if isinstance(v, float)
                                                                            else v for k, v in runs[-1].items()}),
                  flush=True)
        info = httpx.get(server.url + "/status").json()["engine_info"]
    return {"runs": runs, "b_alone_s": statistics.median(services), "engine": info}


def median(runs: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def summarize(off: dict, on: dict) -> dict:
    s = {}
    for arm, data in (("off", off), ("on", on)):
        for key in ("b_queue_wait_ms", "b_ttft_s", "b_done_s", "a_wall_s"):
            s[f"{key}_{arm}"] = round(median(data["runs"], key), 3)
    s["b_alone_s"] = round(statistics.median([off["b_alone_s"], on["b_alone_s"]]), 3)
    s["b_queue_wait_cut_pct"] = round(100 * (1 - s["b_queue_wait_ms_on"] / s["b_queue_wait_ms_off"]), 1)
    s["a_overhead_s"] = round(s["a_wall_s_on"] - s["a_wall_s_off"] - s["b_alone_s"], 3)
    s["a_overhead_pct"] = round(100 * s["a_overhead_s"] / s["a_wall_s_off"], 2)
    s["park_copy_ms"] = round(median(on["runs"], "a_park_copy_ms"), 3)
    # A's wall minus its own engine compute and minus the time it was parked: what a park costs A
    # beyond waiting for B, measured inside each run, so it is immune to run-to-run speed drift.
    for arm, data in (("off", off), ("on", on)):
        s[f"a_outside_compute_s_{arm}"] = round(statistics.median(
            r["a_wall_s"] - (r["a_prompt_ms"] + r["a_decode_ms"] + r["a_parked_ms"]) / 1000 for r in data["runs"]), 3)
    s["a_park_cost_s"] = round(s["a_outside_compute_s_on"] - s["a_outside_compute_s_off"], 3)
    s["a_park_cost_pct"] = round(100 * s["a_park_cost_s"] / s["a_wall_s_off"], 2)
    return s


def plot(off: dict, on: dict, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 1, figsize=(10, 4.2), sharex=True)
    for ax, (name, data) in zip(axes, (("FIFO (--no-prefill-preempt)", off), ("preemption on (the default)", on))):
        r = sorted(data["runs"], key=lambda run: run["a_wall_s"])[len(data["runs"]) // 2]  # the median run
        b0, wait = r["b_sent_s"], r["b_queue_wait_ms"] / 1000
        ax.barh(1, r["a_wall_s"], color="#4c72b0", label="A: long prompt read + decode")
        if r.get("a_parked_ms"):
            ax.barh(1, r["a_parked_ms"] / 1000, left=b0 + wait - 0.02, color="#dddddd", hatch="//",
                    label="A parked")
        ax.barh(0, wait, left=b0, color="#f2c14e", label="B waits in the queue")
        ax.barh(0, r["b_done_s"] - wait, left=b0 + wait, color="#55a868", label="B runs")
        ax.plot([b0 + r["b_ttft_s"]], [0], "k|", markersize=18, label="B's first token")
        ax.set_yticks([0, 1], ["B", "A"])
        ax.set_title(name, fontsize=10, loc="left")
    axes[1].set_xlabel("seconds since A was sent")
    handles, labels = axes[1].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=5, fontsize=8, frameon=False)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    fig.savefig(path, dpi=120)


def title(result: dict) -> str:
    return (f"A = {result['a_tokens']} prompt tokens, B sent {result['b_delay_s']:g} s in "
            f"(chunk {result['chunk']}; median runs; {result['machine']})")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--a-tokens", type=int, default=5000)
    p.add_argument("--a-max-tokens", type=int, default=16)
    p.add_argument("--b-max-tokens", type=int, default=16)
    p.add_argument("--b-delay", type=float, default=3.0)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--chunk", type=int, default=256)
    p.add_argument("--device", default="cpu")
    p.add_argument("--ctx", type=int, help="context for the server (default: the engine's choice)")
    p.add_argument("--out", default=str(ROOT / "bench/results"))
    p.add_argument("--summarize", help="recompute the summary of an existing result JSON and exit")
    a = p.parse_args()
    if a.summarize:
        result = json.loads(Path(a.summarize).read_text())
        result["summary"] = summarize(result["off"], result["on"])
        Path(a.summarize).write_text(json.dumps(result, indent=1) + "\n")
        plot(result["off"], result["on"], Path(a.summarize).with_suffix(".png"), title(result))
        print(json.dumps(result["summary"], indent=1))
        return
    prompt = long_prompt(a.a_tokens)
    print(f"A: {len(prompt)} prompt tokens; B sent {a.b_delay}s in; {a.repeats} repeats per arm", flush=True)
    off = run_arm(False, prompt, a)
    on = run_arm(True, prompt, a)
    summary = summarize(off, on)
    result = {"machine": machine(on["engine"].get("device", a.device)), "a_tokens": len(prompt),
              "b_delay_s": a.b_delay, "chunk": a.chunk, "repeats": a.repeats, "summary": summary,
              "off": off, "on": on}
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"prefill_preempt_{a.device}_{len(prompt)}"
    (out / f"{stem}.json").write_text(json.dumps(result, indent=1) + "\n")
    plot(off, on, out / f"{stem}.png", title(result))
    print(json.dumps(summary, indent=1))
    print(f"wrote {out / stem}.json and .png")


if __name__ == "__main__":
    main()
