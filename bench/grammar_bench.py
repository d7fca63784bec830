"""What constrained decoding costs per token (engine/grammar.py Constraint.restrict): the llguidance
mask of the next token and the masked copy of the logits, timed while a valid output of each
grammar is fed token by token. Vocabularies: the default model's (49K) and
Qwen2's (151K, llama.cpp's ggml-vocab-qwen2.gguf in tests/fixtures/vocab).

    .venv/bin/python bench/grammar_bench.py [--json OUT]
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

from engine.grammar import GrammarTokenizer  # noqa: E402
from engine.model_path import default_model_path  # noqa: E402
from engine.tokenizer import load_tokenizer  # noqa: E402
from serve.chat import ToolPlan  # noqa: E402
from serve.constraints import json_grammar, tool_grammar  # noqa: E402
from serve.tool_calls import FORMATS  # noqa: E402

PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                           "tags": {"type": "array", "items": {"type": "string"}}},
          "required": ["name", "age", "tags"], "additionalProperties": False}
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"]}}}
CASES = {  # grammar -> an output it accepts
    "json_schema": (lambda: json_grammar(PERSON, "bench"),
                    '{"name":"Ada Lovelace","age":36,"tags":["mathematician","writer","analyst"]}'),
    "tool_call generic": (lambda: tool_grammar(ToolPlan(FORMATS["generic"], [WEATHER], "required")),
                          '{"tool_calls":[{"name":"get_weather","arguments":{"city":"Reykjavik","unit":"celsius"}}]}'),
    "tool_call hermes": (lambda: tool_grammar(ToolPlan(FORMATS["hermes"], [WEATHER], "required")),
                         '<tool_call>\n{"name":"get_weather","arguments":{"city":"Reykjavik","unit":"celsius"}}\n</tool_call>\n'),
}


def measure(tokenizer, grammar: str, output: str, repeats: int) -> list[float]:
    """Per-token ms of Constraint.restrict (the mask and the masked logits), over `repeats` passes."""
    gt = GrammarTokenizer(tokenizer, tokenizer.vocab_size)
    ids = tokenizer.encode(output, add_bos=False)
    logits = np.random.default_rng(0).standard_normal(tokenizer.vocab_size).astype(np.float32)
    times = []
    for _ in range(repeats):
        c = gt.constraint(grammar)
        for token in ids:
            t = time.perf_counter()
            masked = c.restrict(logits)
            times.append((time.perf_counter() - t) * 1000)
            assert np.isfinite(masked[token]), (output, token)
            c.accept(token)
    return times


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json")
    p.add_argument("--repeats", type=int, default=20)
    a = p.parse_args()
    vocabs = {"smollm2 (49,152)": load_tokenizer(str(default_model_path())),
              "qwen2 (151,643)": load_tokenizer(str(ROOT / "tests/fixtures/vocab/ggml-vocab-qwen2.gguf"))}
    out = {"machine": f"{platform.processor() or platform.machine()}, numpy {np.__version__}", "ms_per_token": {}}
    for vocab, tokenizer in vocabs.items():
        for name, (make, output) in CASES.items():
            times = measure(tokenizer, make(), output, a.repeats)
            row = {"median": round(float(np.median(times)), 4), "p99": round(float(np.percentile(times, 99)), 4),
                   "tokens": len(times) // a.repeats}
            out["ms_per_token"][f"{vocab} {name}"] = row
            print(f"{vocab:18s} {name:18s} median {row['median']:.3f} ms  p99 {row['p99']:.3f} ms  "
                  f"({row['tokens']} tokens x {a.repeats})", flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
