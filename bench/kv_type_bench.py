"""The KV cache's element type against its cost in quality, memory and speed (engine --kv-type).

For each prompt length, the prompt (natural text: this repository's README, repeated as needed) is
read with each cache type; then 64 tokens are decoded teacher-forced on the float32 cache's greedy
continuation, so that every type sees the same context at every step. Reported per type against
float32: the logits' largest difference and the mean KL divergence of the next-token distribution
over those steps, the share of steps whose greedy token agrees, the tokens of free-running greedy
decoding before the first disagreement, bytes per cached token, and the read and decode rates.

    .venv/bin/python bench/kv_type_bench.py [--model PATH] [--lengths 512,2048,4096] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.engine_bench import machine  # noqa: E402
from engine.ops.backend import select_backend  # noqa: E402
from engine.model.weights import load_model  # noqa: E402
from engine.kvcache.kv import KVCache  # noqa: E402
from engine.model.forward import LlamaModel  # noqa: E402
from engine.modelfile.model_path import resolve_model_path  # noqa: E402
from engine.modelfile.tokenizer import GGUFTokenizer  # noqa: E402

TYPES = ("f32", "f16", "q8_0")
CHUNK = 256


def read(model: LlamaModel, kv: KVCache, prompt: list[int]) -> tuple[np.ndarray, float]:
    """The prompt read in chunks: the last position's logits (vocab,) and the seconds it took."""
    started = time.perf_counter()
    logits = None
    for start in range(0, len(prompt), CHUNK):
        chunk = np.asarray(prompt[start : start + CHUNK], dtype=np.int64)
        logits = model.forward(chunk, start, kv, want_logits=start + CHUNK >= len(prompt))
    return logits, time.perf_counter() - started


def decode(model: LlamaModel, kv: KVCache, first: np.ndarray, at: int, steps: int, forced: list[int] | None):
    """Greedy decode from the logits `first` at position `at`: (logits per step, tokens, seconds). With
    `forced`, step i's input is forced[i] (teacher forcing) instead of the greedy pick."""
    logits, tokens, started = [first], [], time.perf_counter()
    for i in range(steps):
        token = int(np.argmax(logits[-1])) if forced is None else forced[i]
        tokens.append(token)
        logits.append(model.forward(np.asarray([token], dtype=np.int64), at + i, kv, want_logits=True))
    return np.stack(logits[:-1]), tokens, time.perf_counter() - started


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def run(model_path: str, lengths: list[int], steps: int) -> dict:
    backend = select_backend("cpu")
    cfg, weights, reader = load_model(model_path, backend)
    model = LlamaModel(cfg, weights, backend)
    tokenizer = GGUFTokenizer(reader)
    text = (ROOT / "README.md").read_text()
    ids = tokenizer.encode(text)
    out = {"machine": machine(backend.device_name),
           "model": Path(model_path).name, "steps": steps, "cases": []}
    for length in lengths:
        prompt = (ids * (length // len(ids) + 1))[:length]
        runs = {}
        for kv_type in TYPES:  # float32 first: its greedy tokens are everyone's teacher
            kv = KVCache(cfg, length + steps + 1, backend, kv_type=kv_type)
            last, read_s = read(model, kv, prompt)
            forced = None if kv_type == "f32" else runs["f32"]["tokens"]
            logits, tokens, decode_s = decode(model, kv, last, length, steps, forced)
            kv_free = KVCache(cfg, length + steps + 1, backend, kv_type=kv_type)  # free-running greedy
            last_free, _ = read(model, kv_free, prompt)
            _, free_tokens, _ = decode(model, kv_free, last_free, length, steps, None)
            runs[kv_type] = {"logits": logits, "tokens": tokens, "free": free_tokens, "read_s": read_s,
                             "decode_s": decode_s, "bytes_per_token": kv.row_bytes}
        base = runs["f32"]
        for kv_type in TYPES:
            r = runs[kv_type]
            lp, lq = log_softmax(base["logits"]), log_softmax(r["logits"])
            kl = (np.exp(lp) * (lp - lq)).sum(axis=-1)  # KL(f32 || this type) per step
            agree = np.argmax(r["logits"], axis=-1) == np.argmax(base["logits"], axis=-1)
            first_diff = next((i for i, (a, b) in enumerate(zip(base["free"], r["free"])) if a != b), steps)
            out["cases"].append({
                "prompt_tokens": length, "kv_type": kv_type, "bytes_per_token": r["bytes_per_token"],
                "max_abs_logit_diff": round(float(np.abs(r["logits"] - base["logits"]).max()), 4),
                "mean_kl": float(f"{kl.mean():.3g}"), "max_kl": float(f"{kl.max():.3g}"),
                "top1_agreement": round(float(agree.mean()), 4), "greedy_tokens_before_divergence": first_diff,
                "read_tok_s": round(length / r["read_s"], 1), "decode_tok_s": round(steps / r["decode_s"], 1)})
    return out


def table(result: dict) -> str:
    lines = ["| prompt | type | bytes/token | max |dlogit| | mean KL | top-1 agree | greedy same for | read tok/s | decode tok/s |",
             "|---|---|---|---|---|---|---|---|---|"]
    for c in result["cases"]:
        lines.append(f"| {c['prompt_tokens']:,} | {c['kv_type']} | {c['bytes_per_token']:,} | {c['max_abs_logit_diff']} | "
                     f"{c['mean_kl']:.2g} | {100 * c['top1_agreement']:.1f}% | {c['greedy_tokens_before_divergence']}"
                     f"/{result['steps']} | {c['read_tok_s']:,.0f} | {c['decode_tok_s']:,.1f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model")
    p.add_argument("--lengths", default="512,2048,4096")
    p.add_argument("--steps", type=int, default=64)
    p.add_argument("--json")
    a = p.parse_args(argv)
    result = run(str(resolve_model_path(a.model)), [int(n) for n in a.lengths.split(",")], a.steps)
    print(table(result))
    if a.json:
        Path(a.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
