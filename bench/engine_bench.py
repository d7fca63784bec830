"""Engine throughput: load time, prefill tok/s at several prompt lengths, decode tok/s, GPU memory
against the file's size, a profile of one prompt chunk and of one decode step at depth (time per
operation family), and a decode token's time broken down (graph replay, logits copy, sampling).

    python bench/engine_bench.py [--model PATH] [--device cpu|gpu|auto] [--chunk 512] [--repeats 3]
        [--sizes 512,2048] [--profile-depth N] [--weights quantized|fp16] [--kv-type auto|f16|q8_0|...]
        [--label NAME --json FILE]

Runs the engine's own forward pass in process (no server, no pipes), reading prompts in absolute
chunks exactly as `strata --serve` does, and reports medians of repeats with the machine named.
With --label, the result is merged into FILE under that label (one entry per model shape).
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

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine.ops.blas_order import prefer_row_invariant_blas  # noqa: E402

prefer_row_invariant_blas()  # the BLAS settings the engine process runs with, before NumPy and CuPy load

import numpy as np  # noqa: E402

from engine.ops.backend import Backend, select_backend  # noqa: E402
from engine.runner.decode_graph import GraphDecoder  # noqa: E402
from engine.runner.sampling_graph import DrawGraphs  # noqa: E402
from engine.model.weights import keep_expansions, load_model  # noqa: E402
from engine.kvcache.kv import KVCache  # noqa: E402
from engine.core.kv_types import KV_TYPES  # noqa: E402
from engine.model.forward import LlamaModel  # noqa: E402
from engine.modelfile.model_path import resolve_model_path  # noqa: E402
from engine.runner.sampler import Sampler, SamplingParams  # noqa: E402


def machine(device_name: str) -> str:
    cpu = platform.processor() or platform.machine()
    try:
        names = [line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")]
        cpu = names[0] if names else cpu
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} cores, numpy {np.__version__}, device {device_name}"


def merge_result(path: Path, label: str, result: dict) -> None:
    """Write `result` into the JSON file at `path` under `label`, keeping the other labels'."""
    merged = json.loads(path.read_text()) if path.exists() else {}
    path.write_text(json.dumps(merged | {label: result}, indent=1) + "\n")


def prefill_tok_s(model: LlamaModel, kv: KVCache, n: int, chunk: int, backend: Backend) -> float:
    tokens = np.random.default_rng(n).integers(100, model.cfg.vocab_size - 100, n)
    backend.synchronize()
    started = time.perf_counter()
    model.prefill(tokens, kv, chunk)
    backend.synchronize()
    return n / (time.perf_counter() - started)


def decode_tok_s(model: LlamaModel, kv: KVCache, context: int, steps: int, backend: Backend,
                 graphs: GraphDecoder | None = None) -> float:
    """Decode steps after a `context`-token prompt, each sampled greedily where its logits are, as
    the engine's are; through CUDA graph replays when `graphs` is given."""
    tokens = np.random.default_rng(0).integers(100, model.cfg.vocab_size - 100, context + steps)
    greedy = Sampler(SamplingParams(), ())
    model.forward(tokens[:context], 0, kv, want_logits=True)
    if graphs is not None:
        graphs.decode_one(int(tokens[context]), context)  # the bucket's capture stays out of the timing
    backend.synchronize()
    started = time.perf_counter()
    for i in range(steps):
        if graphs is not None:
            logits = graphs.decode_one(int(tokens[context + i]), context + i)
        else:
            logits = model.forward(tokens[context + i:context + i + 1], context + i, kv, want_logits=True, on_device=True)
        if graphs is not None and graphs.owns(logits):  # the engine's pick (ModelRunner.sample)
            graphs.greedy_token()
        else:
            greedy.sample(logits, backend.xp)
    backend.synchronize()
    return steps / (time.perf_counter() - started)


class TimedOps:
    """Wraps the backend's operations: each call bracketed by CUDA events (on the CPU, the clock), time summed per
    name."""

    def __init__(self, ops, xp):
        self.ops, self.xp, self.events = ops, xp, []

    def __getattr__(self, name):
        fn = getattr(self.ops, name)
        if not callable(fn):
            return fn

        def timed(*args, **kwargs):
            if self.xp is np:
                started = time.perf_counter()
                out = fn(*args, **kwargs)
                self.events.append((name, (time.perf_counter() - started) * 1e3, None))
                return out
            start, end = self.xp.cuda.Event(), self.xp.cuda.Event()
            start.record()
            out = fn(*args, **kwargs)
            end.record()
            self.events.append((name, start, end))
            return out

        return timed

    def totals_ms(self) -> dict[str, float]:
        if self.events and self.events[-1][2] is not None:
            self.events[-1][2].synchronize()
        totals: dict[str, float] = {}
        for name, start, end in self.events:
            ms = start if end is None else self.xp.cuda.get_elapsed_time(start, end)
            totals[name] = totals.get(name, 0.0) + ms
        return {k: round(v, 3) for k, v in sorted(totals.items(), key=lambda kv: -kv[1])}


def profile_chunk(model: LlamaModel, kv: KVCache, depth: int, chunk: int, backend: Backend,
                  n: int | None = None) -> dict:
    """n tokens (default: one chunk; 1: an eager decode step) at `depth` (the prefix already
    cached), time per operation family (ms)."""
    n = n or chunk
    tokens = np.random.default_rng(1).integers(100, model.cfg.vocab_size - 100, depth + n)
    model.prefill(tokens[:depth], kv, chunk) if depth else None
    model.ops = TimedOps(backend.ops, backend.xp)
    try:
        model.forward(tokens[depth:], depth, kv, want_logits=True)
        return {"depth": depth, "tokens": n, "ms": model.ops.totals_ms()}
    finally:
        model.ops = backend.ops


def decode_breakdown(model: LlamaModel, kv: KVCache, context: int, steps: int, graphs: GraphDecoder) -> dict:
    """Where a decode token's time goes (medians, ms): the graph replay on the GPU (events), the
    greedy token the graph computed (copied back: what the engine does), the sampler on the device
    (greedy from the logits, and a temperature 0.8 / top-p 0.95 draw launched op by op and as a
    captured draw graph, what the engine does), and for comparison the
    logits copied to the host and the same draw there. whole_step: replay and the graph's token."""
    cp = graphs.cp
    tokens = np.random.default_rng(2).integers(100, model.cfg.vocab_size - 100, context + steps + 1)
    model.forward(tokens[:context], 0, kv, want_logits=True)
    graphs.decode_one(int(tokens[context]), context)  # captured before timing
    entry = graphs.entry(1, context)
    greedy, sampled = Sampler(SamplingParams(), ()), Sampler(SamplingParams(temperature=0.8, top_p=0.95, seed=1), ())
    draws = DrawGraphs(cp)
    graphed = Sampler(SamplingParams(temperature=0.8, top_p=0.95, seed=1), ())
    graphed.sample(graphs.logits[0], cp, draws)  # captured before timing
    times: dict[str, list[float]] = {"replay": [], "greedy_from_graph": [], "sample_greedy": [], "sample_top_p": [],
                                     "sample_top_p_graph": [],
                                     "whole_step": [],
                                     "logits_to_host": [], "host_sample_top_p": []}
    for i in range(steps):
        a, b = cp.cuda.Event(), cp.cuda.Event()
        t0 = time.perf_counter()
        a.record(graphs.stream)
        pos = context + 1 + i
        graphs.replay(entry, [int(tokens[pos])], [kv.lone_table(pos + 1)], [pos])
        b.record(graphs.stream)
        b.synchronize()
        t1 = time.perf_counter()
        int(graphs.argmax.get()[0])
        t_greedy = time.perf_counter()
        greedy.sample(graphs.logits[0], cp)
        t2 = time.perf_counter()
        sampled.sample(graphs.logits[0], cp)
        t3 = time.perf_counter()
        graphed.sample(graphs.logits[0], cp, draws)
        t_graph = time.perf_counter()
        logits = cp.asnumpy(graphs.logits[0])
        t4 = time.perf_counter()
        sampled.sample(logits)
        t5 = time.perf_counter()
        times["replay"].append(cp.cuda.get_elapsed_time(a, b))
        times["greedy_from_graph"].append((t_greedy - t1) * 1e3)
        times["sample_greedy"].append((t2 - t_greedy) * 1e3)
        times["sample_top_p"].append((t3 - t2) * 1e3)
        times["sample_top_p_graph"].append((t_graph - t3) * 1e3)
        times["whole_step"].append((t_greedy - t0) * 1e3)
        times["logits_to_host"].append((t4 - t_graph) * 1e3)
        times["host_sample_top_p"].append((t5 - t4) * 1e3)
    return {"context": context, "ms": {k: round(statistics.median(v), 3) for k, v in times.items()}}


def run(model_path: str, device: str, chunk: int, repeats: int, decode_steps: int, sizes: list[int],
        profile_depth: int | None = None, decode_contexts: tuple[int, ...] = (128,), weights_form: str = "quantized",
        kv_type: str = "auto") -> dict:
    backend = select_backend(device)
    started = time.perf_counter()
    cfg, weights, reader = load_model(model_path, backend, keep_blocks=weights_form != "fp16")
    if weights_form == "kept":  # the blocks, and the prompt steps' matrices expanded once (--prompt-weights resident)
        keep_expansions(backend, weights.layers)
    backend.synchronize()
    load_s = time.perf_counter() - started
    file_mib = sum(int(t.n_bytes) for t in reader.tensors) / 2**20
    weights_mib = backend.xp.get_default_memory_pool().used_bytes() / 2**20 if backend.name == "gpu" else None
    model = LlamaModel(cfg, weights, backend)
    kv = KVCache(cfg, max(sizes + [(profile_depth or 0) + chunk, *decode_contexts]) + decode_steps + 1, backend,
                 kv_type=kv_type)
    prefill_tok_s(model, kv, min(chunk, 256), chunk, backend)  # warm-up
    result = {"machine": machine(backend.device_name), "model": Path(model_path).name,
              "shape": f"{cfg.n_layers} layers, dim {cfg.dim}, ffn {cfg.ffn_dim}, heads {cfg.n_heads}/{cfg.n_kv_heads}",
              "chunk": chunk, "repeats": repeats, "load_s": round(load_s, 2), "weights": weights_form,
              "kv_type": kv.type.name, "file_tensor_mib": round(file_mib)}
    if backend.name == "gpu":
        result["prompt_attention"] = backend.kernels.prompt_attention
    if weights_mib is not None:
        result |= {"gpu_weights_mib": round(weights_mib), "gpu_weights_over_file": round(weights_mib / file_mib, 3)}
    for n in sizes:
        runs = [prefill_tok_s(model, kv, n, chunk, backend) for _ in range(repeats)]
        result[f"prefill_{n}_tok_s"] = round(statistics.median(runs), 1)
    if decode_steps:
        runs = [decode_tok_s(model, kv, 128, decode_steps, backend) for _ in range(repeats)]
        result["decode_eager_tok_s" if backend.name == "gpu" else "decode_tok_s"] = round(statistics.median(runs), 1)
    if decode_steps and backend.name == "gpu":
        graphs = GraphDecoder(model, kv, backend)
        for context in decode_contexts:
            runs = [decode_tok_s(model, kv, context, decode_steps, backend, graphs) for _ in range(repeats)]
            result["decode_tok_s" if context == 128 else f"decode_at_{context}_tok_s"] = round(statistics.median(runs), 1)
        result["decode_breakdown"] = decode_breakdown(model, kv, decode_contexts[0], decode_steps, graphs)
    if profile_depth is not None and backend.name == "gpu":
        result["profile"] = profile_chunk(model, kv, profile_depth, chunk, backend)
        result["profile_decode"] = profile_chunk(model, kv, profile_depth, chunk, backend, n=1)
    if backend.name == "gpu":
        result["peak_gpu_mib"] = round(backend.xp.get_default_memory_pool().total_bytes() / 2**20)
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model")
    p.add_argument("--device", default="cpu", choices=("auto", "cpu", "gpu"))
    p.add_argument("--chunk", type=int, default=512)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--decode-steps", type=int, default=64)
    p.add_argument("--sizes", default="512,2048")
    p.add_argument("--profile-depth", type=int, help="GPU: profile one chunk read at this depth")
    p.add_argument("--decode-contexts", default="128", help="GPU: decode (graphs) after prompts of these lengths")
    p.add_argument("--weights", choices=("quantized", "kept", "fp16"), default="quantized",
                   help="GPU: keep quantized weights in their blocks (a prompt step expands each matrix), the blocks "
                        "and the prompt steps' matrices expanded once (kept: the engine's --prompt-weights resident), "
                        "or expand them at load")
    p.add_argument("--kv-type", choices=KV_TYPES, default="auto", help="the KV cache's element type (engine/core/kv_types.py)")
    p.add_argument("--json", help="also write the result here")
    p.add_argument("--label", help="merge the result into --json under this label")
    a = p.parse_args()
    result = run(str(resolve_model_path(a.model)), a.device, a.chunk, a.repeats, a.decode_steps,
                 [int(s) for s in a.sizes.split(",")], a.profile_depth,
                 tuple(int(c) for c in a.decode_contexts.split(",")), a.weights, a.kv_type)
    print(json.dumps(result, indent=1))
    if a.json and a.label:
        merge_result(Path(a.json), a.label, result)
    elif a.json:
        Path(a.json).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
