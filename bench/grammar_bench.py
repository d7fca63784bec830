"""What constrained decoding costs per token (engine/runner/grammar_mask.py Constraint.restrict): the llguidance
mask of the next token and the masked copy of the logits, timed while a valid output of each
grammar is fed token by token. Vocabularies: the default model's (49K) and Qwen2.5's (151,665 with
its added tokens: the real-model fixture's, `make fixture`; else llama.cpp's ggml-vocab-qwen2.gguf
in tests/fixtures/vocab). With --gpu the logits stay on the GPU, as the engine's do there: the mask's
words go to the device and the masked copy is made there (CuPy; the time includes the upload and
waits for the device).

    .venv/bin/python bench/grammar_bench.py [--gpu] [--json OUT]
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from engine.modelfile.grammar_tokenizer import GrammarTokenizer  # noqa: E402
from engine.modelfile.model_path import ModelNotFound, default_model_path  # noqa: E402
from engine.modelfile.tokenizer import load_tokenizer  # noqa: E402
from serve.api.chat import ToolPlan  # noqa: E402
from serve.api.constraints import json_grammar, tool_grammar  # noqa: E402
from serve.api.response_tools import build as build_tools  # noqa: E402
from serve.api.tool_calls import FORMATS  # noqa: E402

from tools.fixtures.fetch_fixture import fixture_path  # noqa: E402

PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                           "tags": {"type": "array", "items": {"type": "string"}}},
          "required": ["name", "age", "tags"], "additionalProperties": False}
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"]}}}
APPLY_PATCH = (ROOT / "tests/fixtures/apply_patch.lark").read_text()
PATCH = "*** Begin Patch\n*** Update File: calc.py\n@@ def add(a, b):\n-    return a - b\n+    return a + b\n*** End Patch\n"
CODEX = build_tools([{"type": "custom", "name": "apply_patch",
                      "format": {"type": "grammar", "syntax": "lark", "definition": APPLY_PATCH}}])


def plan(fmt: str, tools: list[dict], choice: str, enforced=None) -> ToolPlan:
    return ToolPlan(FORMATS[fmt], tools, choice, True, enforced or {})


CASES = {  # grammar (from the tokenizer) -> an output it accepts
    "json_schema": (lambda tk: json_grammar(PERSON, "bench"),
                    '{"name":"Ada Lovelace","age":36,"tags":["mathematician","writer","analyst"]}'),
    "tool_call generic": (lambda tk: tool_grammar(plan("generic", [WEATHER], "required"), tk),
                          '{"tool_calls":[{"name":"get_weather","arguments":{"city":"Reykjavik","unit":"celsius"}}]}'),
    "tool_call hermes": (lambda tk: tool_grammar(plan("hermes", [WEATHER], "required"), tk),
                         '<tool_call>\n{"name":"get_weather","arguments":{"city":"Reykjavik","unit":"celsius"}}\n</tool_call>'),
    "apply_patch auto": (lambda tk: tool_grammar(plan("hermes", CODEX.functions, "auto", CODEX.enforced), tk),
                         "I will fix the sign.\n<tool_call>\n" + json.dumps(
                             {"name": "apply_patch", "arguments": {"input": PATCH}}, separators=(",", ":")) + "\n</tool_call>"),
}


def measure(tokenizer, grammar: str, output: str, repeats: int, gpu: bool) -> list[float]:
    """Per-token ms of Constraint.restrict (the mask and the masked logits, on the GPU with --gpu),
    over `repeats` passes."""
    gt = GrammarTokenizer(tokenizer, tokenizer.vocab_size)
    ids = tokenizer.encode(output, add_bos=False)
    logits = np.random.default_rng(0).standard_normal(tokenizer.vocab_size).astype(np.float32)  # (vocab,)
    if gpu:
        import cupy as cp
        on_device = cp.asarray(logits)
        cp.cuda.Device().synchronize()
    times = []
    for _ in range(repeats):
        c = gt.constraint(grammar)
        for token in ids:
            t = time.perf_counter()
            masked = c.restrict(on_device, cp) if gpu else c.restrict(logits)
            if gpu:
                cp.cuda.Device().synchronize()
            times.append((time.perf_counter() - t) * 1000)
            assert np.isfinite(float(masked[token])), (output, token)
            c.accept(token)
    return times


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json")
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--gpu", action="store_true", help="the logits on the GPU, masked there")
    a = p.parse_args()
    qwen = fixture_path() if fixture_path().is_file() else ROOT / "tests/fixtures/vocab/ggml-vocab-qwen2.gguf"
    vocabs = {"qwen2.5": load_tokenizer(str(qwen))}
    try:  # the default model's package (absent on the device, where only the tree travels)
        vocabs = {"smollm2": load_tokenizer(str(default_model_path()))} | vocabs
    except ModelNotFound:
        pass
    out = {"machine": f"{platform.processor() or platform.machine()}, numpy {np.__version__}" + (
        f", {gpu_name()}" if a.gpu else ""), "qwen_vocabulary": qwen.name, "ms_per_token": {}}
    for short, tokenizer in vocabs.items():
        vocab = f"{short} ({tokenizer.vocab_size:,})"
        for name, (make, output) in CASES.items():
            times = measure(tokenizer, make(tokenizer), output, a.repeats, a.gpu)
            row = {"median": round(float(np.median(times)), 4), "p99": round(float(np.percentile(times, 99)), 4),
                   "tokens": len(times) // a.repeats}
            out["ms_per_token"][f"{vocab} {name}"] = row
            print(f"{vocab:18s} {name:18s} median {row['median']:.3f} ms  p99 {row['p99']:.3f} ms  "
                  f"({row['tokens']} tokens x {a.repeats})", flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1) + "\n")
    return 0


def gpu_name() -> str:
    import cupy as cp
    return cp.cuda.runtime.getDeviceProperties(0)["name"].decode()


if __name__ == "__main__":
    sys.exit(main())
