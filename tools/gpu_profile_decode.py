"""Where a decode step's time goes on the GPU: cProfile of 32 decode steps, top functions.

    python tools/gpu_profile_decode.py --model PATH
"""
from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine.backend import select_backend  # noqa: E402
from engine.gguf_model import load_model  # noqa: E402
from engine.kv import KVCache  # noqa: E402
from engine.model import LlamaModel  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--model", required=True)
    p.add_argument("--device", default="gpu")
    a = p.parse_args()
    backend = select_backend(a.device)
    cfg, weights, _ = load_model(a.model, backend)
    model = LlamaModel(cfg, weights, backend)
    kv = KVCache(cfg, 1024, backend)
    tokens = np.arange(100, 400)
    model.forward(tokens[:128], 0, kv, want_logits=True)

    def steps(n: int) -> float:
        backend.synchronize()
        started = time.perf_counter()
        for i in range(n):
            model.forward(tokens[128 + i:129 + i], 128 + i, kv, want_logits=True)
        backend.synchronize()
        return (time.perf_counter() - started) / n * 1000

    print(f"decode step: {steps(32):.2f} ms")
    profiler = cProfile.Profile()
    profiler.enable()
    steps(32)
    profiler.disable()
    pstats.Stats(profiler).sort_stats("tottime").print_stats(15)


if __name__ == "__main__":
    main()
