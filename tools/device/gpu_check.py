"""GPU run of the engine: CuPy vs NumPy logits on the golden prompts (same machine, both paths),
captured decode steps against eager ones, GPU prefill/decode tok/s, and `strata --serve --device
gpu` end to end over its pipes.

    python tools/device/gpu_check.py --model PATH [--out result.json]

Run on a machine with CuPy and a GPU (see tools/device/gpu_run.sh for the device tool recipe).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from engine.ops.backend import select_backend  # noqa: E402
from engine.runner.decode_graph import GraphDecoder  # noqa: E402
from engine.model.weights import load_model  # noqa: E402
from engine.kvcache.kv import KVCache  # noqa: E402
from engine.model.forward import LlamaModel  # noqa: E402
from protocol import messages as m  # noqa: E402
from protocol.codec import decode, encode  # noqa: E402

import engine_bench  # noqa: E402

GREEDY = 16


def last_logits_and_greedy(model: LlamaModel, ids: list[int], chunk: int, backend) -> tuple[np.ndarray, list[int]]:
    kv = KVCache(model.cfg, 2048, backend)
    logits = model.prefill(np.asarray(ids), kv, chunk)
    first, out, cur = logits.copy(), [], logits
    for _ in range(GREEDY):
        out.append(int(np.argmax(cur)))
        if out[-1] == 2:
            break
        cur = model.forward(np.asarray(out[-1:]), len(ids) + len(out) - 1, kv, want_logits=True)
    return first, out


def compare_paths(model_path: str) -> list[dict]:
    cases = json.loads((ROOT / "tests/fixtures/logits_golden.json").read_text())["cases"]
    paths = {}
    for device in ("cpu", "gpu"):
        backend = select_backend(device)
        cfg, weights, _ = load_model(model_path, backend)
        model = LlamaModel(cfg, weights, backend)
        paths[device] = [last_logits_and_greedy(model, c["ids"], 64, backend) for c in cases]
    rows = []
    for case, (cpu_l, cpu_g), (gpu_l, gpu_g) in zip(cases, paths["cpu"], paths["gpu"]):
        top5 = list(np.argsort(-cpu_l)[:5])
        rows.append({"prompt": case["text"][:40], "tokens": len(case["ids"]),
                     "max_abs_logit_diff": float(np.max(np.abs(cpu_l - gpu_l))),
                     "top5_cpu": [int(t) for t in top5], "top5_gpu": [int(t) for t in np.argsort(-gpu_l)[:5]],
                     "top1_equal": int(np.argmax(cpu_l)) == int(np.argmax(gpu_l)),
                     "greedy_equal": cpu_g == gpu_g, "greedy_equals_reference": gpu_g == case["greedy"]})
    return rows


def graph_vs_eager(model_path: str, steps: int = 48) -> dict:
    """The same greedy decode twice on the GPU, each with its own KV cache: CUDA graph replays
    (GraphDecoder, what the engine runs) and eager forwards of one token. From a 1,000-token prompt,
    so the steps cross from the 1,024-position graph to the 2,048 one. The logits must be the same
    bits, and the graph's own argmax the eager logits' argmax."""
    backend = select_backend("gpu")
    cfg, weights, _ = load_model(model_path, backend)
    model = LlamaModel(cfg, weights, backend)
    base = json.loads((ROOT / "tests/fixtures/logits_golden.json").read_text())["cases"][3]["ids"]
    prompt = np.asarray((base * 3)[:1000])
    kv_graph, kv_eager = KVCache(cfg, 4096, backend), KVCache(cfg, 4096, backend)
    graphs = GraphDecoder(model, kv_graph, backend)
    token = int(np.argmax(model.prefill(prompt, kv_graph, 512)))
    model.prefill(prompt, kv_eager, 512)
    worst, same_tokens, argmax_agrees = 0.0, True, True
    for i in range(steps):
        pos = len(prompt) + i
        replayed = graphs.decode_one(token, pos)
        captured = graphs.owns(replayed)  # False on a bucket's first step (its eager run is returned)
        g = backend.to_host(replayed)
        e = model.forward(np.asarray([token]), pos, kv_eager, want_logits=True)
        worst = max(worst, float(np.max(np.abs(g - e))))
        argmax_agrees &= not captured or graphs.greedy_token() == int(np.argmax(e))
        same_tokens &= int(np.argmax(g)) == int(np.argmax(e))
        token = int(np.argmax(e))
    return {"steps": steps, "from_position": len(prompt), "graphs": sorted(graphs.captured),
            "max_abs_logit_diff": worst, "same_tokens": bool(same_tokens), "graph_argmax_agrees": bool(argmax_agrees)}


def engine_process_on_gpu(model_path: str) -> dict:
    proc = subprocess.Popen([sys.executable, "-m", "engine", "--serve", "--device", "gpu", "--model", model_path],
                            cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)
    info = {}
    while True:
        msg = decode(proc.stdout.readline())
        if isinstance(msg, m.Info):
            info = msg.fields
        if isinstance(msg, m.Ready):
            break
    ids = json.loads((ROOT / "tests/fixtures/logits_golden.json").read_text())["cases"][0]["ids"]
    started = time.perf_counter()
    proc.stdin.write(encode(m.Gen(20, tuple(ids), {}, 1)) + "\n")
    proc.stdin.flush()
    tokens, done = [], None
    while done is None:
        msg = decode(proc.stdout.readline())
        if isinstance(msg, m.Token):
            tokens.append(msg.token)
        elif isinstance(msg, (m.Done, m.Err)):
            done = msg
    proc.stdin.write("QUIT\n")
    proc.stdin.flush()
    proc.wait(30)
    return {"device": info.get("device"), "tokens": tokens, "done": encode(done),
            "wall_s": round(time.perf_counter() - started, 3), "exit_code": proc.returncode}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--model", required=True)
    p.add_argument("--out", default="gpu_check.json")
    a = p.parse_args()
    result = {"parity": compare_paths(a.model)}
    print(json.dumps(result["parity"], indent=1), flush=True)
    result["graph_vs_eager"] = graph_vs_eager(a.model)
    print(json.dumps(result["graph_vs_eager"]), flush=True)
    result["engine_process"] = engine_process_on_gpu(a.model)
    print(json.dumps(result["engine_process"]), flush=True)
    result["bench"] = {chunk: engine_bench.run(a.model, "gpu", chunk, 5, 128, [512, 2048, 8192])
                       for chunk in (512, 2048)}
    print(json.dumps(result["bench"], indent=1), flush=True)
    Path(a.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
