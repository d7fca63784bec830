"""Engine throughput: prefill tok/s at 512 and 2048 prompt tokens, and decode tok/s.

    python bench/engine_bench.py [--model PATH] [--device cpu|gpu|auto] [--chunk 512] [--repeats 3]

Runs the engine's own forward pass in process (no server, no pipes), reading prompts in absolute
chunks exactly as `strata --serve` does, and reports medians of repeats with the machine named.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine.backend import Backend, select_backend  # noqa: E402
from engine.gguf_model import load_model  # noqa: E402
from engine.kv import KVCache  # noqa: E402
from engine.model import LlamaModel  # noqa: E402
from engine.model_path import resolve_model_path  # noqa: E402


def machine(device_name: str) -> str:
    cpu = platform.processor() or platform.machine()
    try:
        names = [line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")]
        cpu = names[0] if names else cpu
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} cores, numpy {np.__version__}, device {device_name}"


def prefill_tok_s(model: LlamaModel, kv: KVCache, n: int, chunk: int, backend: Backend) -> float:
    tokens = np.random.default_rng(n).integers(100, model.cfg.vocab_size - 100, n)
    backend.synchronize()
    started = time.perf_counter()
    model.prefill(tokens, kv, chunk)
    backend.synchronize()
    return n / (time.perf_counter() - started)


def decode_tok_s(model: LlamaModel, kv: KVCache, context: int, steps: int, backend: Backend) -> float:
    tokens = np.random.default_rng(0).integers(100, model.cfg.vocab_size - 100, context + steps)
    model.forward(tokens[:context], 0, kv, want_logits=True)
    backend.synchronize()
    started = time.perf_counter()
    for i in range(steps):
        model.forward(tokens[context + i:context + i + 1], context + i, kv, want_logits=True)
    backend.synchronize()
    return steps / (time.perf_counter() - started)


def run(model_path: str, device: str, chunk: int, repeats: int, decode_steps: int, sizes: list[int]) -> dict:
    backend = select_backend(device)
    cfg, weights, _ = load_model(model_path, backend)
    model = LlamaModel(cfg, weights, backend)
    kv = KVCache(cfg, max(sizes) + decode_steps + 1, backend)
    prefill_tok_s(model, kv, min(chunk, 256), chunk, backend)  # warm-up
    result = {"machine": machine(backend.device_name), "model": Path(model_path).name, "chunk": chunk, "repeats": repeats}
    for n in sizes:
        runs = [prefill_tok_s(model, kv, n, chunk, backend) for _ in range(repeats)]
        result[f"prefill_{n}_tok_s"] = round(statistics.median(runs), 1)
    runs = [decode_tok_s(model, kv, 128, decode_steps, backend) for _ in range(repeats)]
    result["decode_tok_s"] = round(statistics.median(runs), 1)
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model")
    p.add_argument("--device", default="cpu", choices=("auto", "cpu", "gpu"))
    p.add_argument("--chunk", type=int, default=512)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--decode-steps", type=int, default=64)
    p.add_argument("--sizes", default="512,2048")
    p.add_argument("--json", help="also write the result here")
    a = p.parse_args()
    result = run(str(resolve_model_path(a.model)), a.device, a.chunk, a.repeats, a.decode_steps,
                 [int(s) for s in a.sizes.split(",")])
    print(json.dumps(result, indent=1))
    if a.json:
        Path(a.json).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
