"""Make tests/fixtures/arch_golden.json: each model family beside llama (qwen2, qwen3, qwen3moe) run by
an independent implementation, on a tiny GGUF with random weights.

The GGUFs are made by tools/make_synthetic_gguf.py with the arguments recorded in the fixture (fixed
seeds), in this project's environment; the test makes them again and checks their sha256 first, so
the reference numbers are about exactly that file. The reference is Hugging Face transformers
(PyTorch, CPU, float32) loading the same GGUF (its own GGUF reader and dequantization, its own
Qwen2/Qwen3/Qwen3-MoE modelling code); it shares no code with Strata's engine. The model config is
given explicitly from the GGUF's metadata (transformers' GGUF mapping leaves head_dim and the expert
FFN width of these families at their defaults). Run it in a separate environment:

    .venv/bin/python tools/make_arch_fixture.py make /tmp/arch          # the GGUFs (project env)
    python -m venv /tmp/ref && /tmp/ref/bin/pip install torch transformers gguf
    /tmp/ref/bin/python tools/make_arch_fixture.py reference /tmp/arch  # the fixture

Recorded per family and prompt: the top logits and the logits at fixed token ids of the last
position, and greedy continuations; for qwen3moe, each layer's chosen experts and their weights
for every prompt token.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "tests/fixtures/arch_golden.json"
SHAPE = ["--layers", "2", "--heads", "4", "--kv-heads", "2", "--ctx", "512", "--type", "F32"]
MODELS = {  # family -> make_synthetic_gguf.py arguments (head widths the GPU kernels take: 64, 128)
    "qwen2": ["--arch", "qwen2", *SHAPE, "--dim", "256", "--ffn", "96", "--seed", "11"],
    "qwen3": ["--arch", "qwen3", *SHAPE, "--dim", "128", "--ffn", "96", "--head-dim", "64", "--seed", "12"],  # 4 x 64 over 128
    "qwen3moe": ["--arch", "qwen3moe", *SHAPE, "--dim", "128", "--head-dim", "64", "--experts", "8", "--experts-used", "3",
                 "--expert-ffn", "64", "--seed", "13"],
}
PROMPTS = [[1, 504, 3575, 282, 4649, 314, 7042, 30], [9745, 198, 378, 28518, 216, 260, 216, 3201, 9649, 4521, 17, 99],
           [42]]
TOP, PROBES, GREEDY = 12, 24, 8


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def make(out: Path, family: str, args: list[str]) -> Path:
    """The family's tiny GGUF in `out` (this project's environment)."""
    path = out / f"{family}.gguf"
    subprocess.run([sys.executable, str(ROOT / "tools/make_synthetic_gguf.py"), str(path), *args], check=True,
                   capture_output=True)
    return path


def reference(folder: Path) -> None:
    import numpy as np
    import torch
    import transformers
    from gguf import GGUFReader

    doc = {"made_by": f"tools/make_arch_fixture.py: transformers {transformers.__version__}, torch {torch.__version__} "
                      "(CPU, float32) loading each GGUF", "models": {}}
    probes = [int(i) for i in np.random.default_rng(0).choice(49152, PROBES, replace=False)]
    for family, args in MODELS.items():
        path = folder / f"{family}.gguf"
        model = load_reference(path, family, GGUFReader(str(path)))
        cases = []
        for ids in PROMPTS:
            with torch.no_grad():
                out = model(torch.tensor([ids]), output_router_logits=family == "qwen3moe")
                greedy = model.generate(torch.tensor([ids]), max_new_tokens=GREEDY, do_sample=False,
                                        pad_token_id=0, eos_token_id=None)
            last = out.logits[0, -1]
            vals, idx = torch.topk(last, TOP)
            case = {"ids": ids, "top_ids": idx.tolist(), "top_logits": [float(v) for v in vals],
                    "probe_logits": [float(last[i]) for i in probes], "greedy": greedy[0, len(ids):].tolist()}
            if family == "qwen3moe":
                case["routes"] = routes(out.router_logits, model.config)
            cases.append(case)
        doc["models"][family] = {"args": args, "sha256": sha256(path), "probe_ids": probes, "cases": cases}
        print(f"{family}: greedy {[c['greedy'] for c in cases]}")
    FIXTURE.write_text(json.dumps(doc) + "\n")
    print(f"wrote {FIXTURE}")


def load_reference(path: Path, family: str, reader):
    """transformers' model for the family, its config written out from the GGUF's metadata."""
    import torch
    import transformers

    f = lambda key: reader.fields[f"{family}.{key}"].contents()  # noqa: E731
    common = dict(vocab_size=len(reader.fields["tokenizer.ggml.tokens"].data), hidden_size=f("embedding_length"),
                  num_hidden_layers=f("block_count"), num_attention_heads=f("attention.head_count"),
                  num_key_value_heads=f("attention.head_count_kv"), rms_norm_eps=f("attention.layer_norm_rms_epsilon"),
                  max_position_embeddings=f("context_length"), rope_theta=f("rope.freq_base"),
                  tie_word_embeddings=all(t.name != "output.weight" for t in reader.tensors), torch_dtype="float32")
    if family == "qwen2":
        config = transformers.Qwen2Config(intermediate_size=f("feed_forward_length"), **common)
    elif family == "qwen3":
        config = transformers.Qwen3Config(intermediate_size=f("feed_forward_length"), head_dim=f("attention.key_length"),
                                          **common)
    else:
        config = transformers.Qwen3MoeConfig(
            intermediate_size=f("expert_feed_forward_length"), head_dim=f("attention.key_length"),
            num_experts=f("expert_count"), num_experts_per_tok=f("expert_used_count"),
            moe_intermediate_size=f("expert_feed_forward_length"), norm_topk_prob=True, decoder_sparse_step=1,
            mlp_only_layers=[], **common)
    return transformers.AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, config=config, torch_dtype=torch.float32).eval()


def routes(router_logits, config) -> list[dict]:
    """Per layer: each token's chosen experts (descending weight) and their weights, as Qwen3-MoE
    routes (softmax over all experts in float32, top-k, rescaled to sum to 1)."""
    import torch

    out = []
    for layer, logits in enumerate(router_logits):
        p = torch.softmax(logits.float(), dim=-1)
        w, e = torch.topk(p, config.num_experts_per_tok, dim=-1)
        w = w / w.sum(dim=-1, keepdim=True)
        out.append({"layer": layer, "experts": e.tolist(), "weights": w.tolist()})
    return out


def fixture_main(doc: str, models: dict[str, list[str]], make_reference) -> int:
    """A fixture tool's two steps: `make FOLDER` (the GGUFs, this project's environment) and
    `reference FOLDER` (the fixture, in the environment with transformers)."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("step", choices=["make", "reference"])
    p.add_argument("folder", type=Path)
    a = p.parse_args()
    a.folder.mkdir(parents=True, exist_ok=True)
    if a.step == "make":
        for name, args in models.items():
            print(make(a.folder, name, args))
    else:
        make_reference(a.folder)
    return 0


if __name__ == "__main__":
    sys.exit(fixture_main(__doc__, MODELS, reference))
