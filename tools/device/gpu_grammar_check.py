"""Constrained decoding on the GPU (engine/runner/grammar_mask.py through the CuPy sampler path): the engine
process on a model, GENs with grammars (a regex, a JSON schema), greedy (after a decode graph's
replay) and with temperature: every answer matches its grammar.

    python tools/device/gpu_grammar_check.py --model FILE [--device gpu] [--json OUT]
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import llguidance  # noqa: E402

from engine.modelfile.tokenizer import load_tokenizer  # noqa: E402
from protocol import messages as m  # noqa: E402
from protocol.codec import decode, encode  # noqa: E402

SCHEMA = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                           "days": {"type": "integer", "minimum": 1, "maximum": 9}},
          "required": ["city", "days"], "additionalProperties": False}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--model", required=True)
    p.add_argument("--device", default="gpu")
    p.add_argument("--json")
    a = p.parse_args()
    tok = load_tokenizer(a.model)
    proc = subprocess.Popen([sys.executable, "-m", "engine", "--serve", "--model", a.model, "--device", a.device,
                             "--ctx", "1024"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT)

    def run(ident: int, grammar: str, params: dict) -> str:
        proc.stdin.write(encode(m.Gen(60, tuple(tok.encode("The weather in", add_bos=False)),
                                      params | {"grammar": grammar}, ident)) + "\n")
        proc.stdin.flush()
        tokens = []
        while True:
            msg = decode(proc.stdout.readline().rstrip("\n"))
            if isinstance(msg, m.Token):
                tokens.append(msg.token)
            elif isinstance(msg, (m.Done, m.Err)):
                assert isinstance(msg, m.Done), msg
                return tok.decode(tokens)

    while not isinstance(decode(proc.stdout.readline().rstrip("\n")), m.Ready):
        pass
    regex, schema = llguidance.LLMatcher.grammar_from_regex("(Lyon|Marseille|Nice) [0-9]{2}"), \
        llguidance.LLMatcher.grammar_from_json_schema(SCHEMA, defaults={"whitespace_flexible": False})
    rows, ident = [], 0
    for name, grammar, ok in (("regex", regex, lambda t: re.fullmatch(r"(Lyon|Marseille|Nice) [0-9]{2}", t)),
                              ("json_schema", schema, lambda t: valid(t))):
        for params in ({"temperature": 0.0}, {"temperature": 0.9, "seed": 5}, {"temperature": 1.2, "seed": 6}):
            ident += 1
            text = run(ident, grammar, params)
            rows.append({"grammar": name, "params": params, "text": text, "ok": bool(ok(text))})
            print(json.dumps(rows[-1]), flush=True)
    proc.stdin.write("QUIT\n")
    proc.stdin.flush()
    proc.wait(timeout=60)
    report = {"all_ok": all(r["ok"] for r in rows), "rows": rows}
    if a.json:
        Path(a.json).write_text(json.dumps(report, indent=1) + "\n")
    print("ALL MATCH" if report["all_ok"] else "MISMATCH", flush=True)
    return 0 if report["all_ok"] else 1


def valid(text: str) -> bool:
    try:
        obj = json.loads(text)
    except ValueError:
        return False
    return set(obj) == {"city", "days"} and isinstance(obj["city"], str) and len(obj["city"]) <= 12 \
        and isinstance(obj["days"], int) and 1 <= obj["days"] <= 9


if __name__ == "__main__":
    sys.exit(main())
