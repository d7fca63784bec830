"""Make tests/fixtures/logits_golden.json: reference logits from an independent implementation.

The reference is Hugging Face transformers (PyTorch, CPU, float32) loading the same GGUF file
(it dequantizes the weights itself); token ids come from llama.cpp's tokenizer. Neither shares
code with Strata's engine. Run it in a separate environment (these are not Strata dependencies):
    python -m venv /tmp/ref && /tmp/ref/bin/pip install torch transformers accelerate gguf llama-cpp-python
    /tmp/ref/bin/python tools/make_logits_fixture.py
For each prompt it records the top-10 logits at a few positions and 16 greedy tokens.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from make_tokenizer_fixture import ROOT, default_model

CHATML = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n" \
         "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"
PROMPTS = [
    CHATML.format("What is the capital of France?"),
    CHATML.format("Write a Python function that returns the sum of a list."),
    "The history of the printing press begins in",
    " ".join(f"Line {i}: the quick brown fox jumps over the lazy dog number {i * 7}." for i in range(24)),
]
TOP = 10
GREEDY = 16


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--model", default=None)
    p.add_argument("--out", default=str(ROOT / "tests/fixtures/logits_golden.json"))
    a = p.parse_args()
    import llama_cpp
    import torch
    import transformers

    path = Path(a.model or default_model())
    vocab = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, torch_dtype=torch.float32).eval()
    cases = []
    for text in PROMPTS:
        ids = vocab.tokenize(text.encode(), add_bos=False, special=True)
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0]  # (n, vocab)
            out = model.generate(torch.tensor([ids]), max_new_tokens=GREEDY, do_sample=False,
                                 eos_token_id=2, pad_token_id=2)
        positions = sorted({0, len(ids) // 2, len(ids) - 1})
        tops = []
        for pos in positions:
            vals, idx = torch.topk(logits[pos], TOP)
            tops.append({"pos": pos, "ids": idx.tolist(), "logits": [round(float(v), 5) for v in vals]})
        cases.append({"text": text, "ids": ids, "top": tops, "greedy": out[0, len(ids):].tolist()})
        print(f"{len(ids)} tokens; top at last position: {tops[-1]['ids'][:3]}")
    doc = {"made_by": f"tools/make_logits_fixture.py: transformers {transformers.__version__}, torch "
                      f"{torch.__version__} (CPU, float32) loading {path.name}; ids from llama.cpp's tokenizer",
           "cases": cases}
    Path(a.out).write_text(json.dumps(doc, ensure_ascii=False) + "\n")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
