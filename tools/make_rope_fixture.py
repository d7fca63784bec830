"""Make tests/fixtures/rope_golden.json: rope scaling (Llama 3.1's per-frequency factors, YaRN, linear)
run by an independent implementation on tiny GGUFs with random weights, at positions past the
original context.

The GGUFs are made by tools/make_synthetic_gguf.py with the arguments recorded in the fixture (fixed
seeds); the test makes them again and checks their sha256 first. The reference is Hugging Face
transformers (PyTorch, CPU, float32) loading the same GGUF, its rope_scaling given as the
checkpoint's config.json gives it (rope_type llama3 / yarn / linear): transformers computes the
frequencies from those parameters, Strata from what the GGUF holds (the rope_freqs tensor the
converter precomputed, the rope.scaling keys), so the two meet only if both are right. Run it in a
separate environment, as tools/make_arch_fixture.py says:

    .venv/bin/python tools/make_rope_fixture.py make /tmp/rope
    /tmp/ref/bin/python tools/make_rope_fixture.py reference /tmp/rope
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))

from make_arch_fixture import GREEDY, PROBES, TOP, fixture_main, sha256  # noqa: E402

FIXTURE = ROOT / "tests/fixtures/rope_golden.json"
ORIGINAL = 64  # the original context of every model here: the prompts run to 3x past it
SHAPE = ["--layers", "2", "--dim", "256", "--heads", "4", "--kv-heads", "2", "--ffn", "96", "--type", "F32"]
MODELS = {  # name -> (make_synthetic_gguf.py arguments, the checkpoint's rope_scaling, max_position_embeddings)
    "llama3": (["--arch", "llama", *SHAPE, "--ctx", "512", "--seed", "21", "--llama3-rope", f"8,1,4,{ORIGINAL}"],
               {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": ORIGINAL}, 512),
    "qwen2-yarn": (["--arch", "qwen2", *SHAPE, "--ctx", str(4 * ORIGINAL), "--seed", "22", "--yarn", f"4,{ORIGINAL}"],
                   {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": ORIGINAL}, 4 * ORIGINAL),
}
PROMPT_LENGTHS = (40, 150, 200)  # within the original context, and past it


def prompts() -> list[list[int]]:
    import numpy as np

    rng = np.random.default_rng(5)
    return [[int(t) for t in rng.integers(100, 49000, n)] for n in PROMPT_LENGTHS]


def reference(folder: Path) -> None:
    import numpy as np
    import torch
    import transformers
    from gguf import GGUFReader

    doc = {"made_by": f"tools/make_rope_fixture.py: transformers {transformers.__version__}, torch {torch.__version__} "
                      "(CPU, float32) loading each GGUF", "models": {}}
    probes = [int(i) for i in np.random.default_rng(0).choice(49152, PROBES, replace=False)]
    for name, (args, scaling, positions) in MODELS.items():
        path = folder / f"{name}.gguf"
        model = load_reference(path, GGUFReader(str(path)), scaling, positions)
        cases = []
        for ids in prompts():
            with torch.no_grad():
                last = model(torch.tensor([ids])).logits[0, -1]
                greedy = model.generate(torch.tensor([ids]), max_new_tokens=GREEDY, do_sample=False,
                                        pad_token_id=0, eos_token_id=None)
            vals, idx = torch.topk(last, TOP)
            cases.append({"ids": ids, "top_ids": idx.tolist(), "top_logits": [float(v) for v in vals],
                          "probe_logits": [float(last[i]) for i in probes], "greedy": greedy[0, len(ids):].tolist()})
        doc["models"][name] = {"args": args, "rope_scaling": scaling, "sha256": sha256(path), "probe_ids": probes,
                               "cases": cases}
        print(f"{name}: greedy {[c['greedy'] for c in cases]}")
    FIXTURE.write_text(json.dumps(doc) + "\n")
    print(f"wrote {FIXTURE}")


def load_reference(path: Path, reader, scaling: dict, positions: int):
    import torch
    import transformers

    arch = reader.fields["general.architecture"].contents()
    f = lambda key: reader.fields[f"{arch}.{key}"].contents()  # noqa: E731
    common = dict(vocab_size=len(reader.fields["tokenizer.ggml.tokens"].data), hidden_size=f("embedding_length"),
                  num_hidden_layers=f("block_count"), num_attention_heads=f("attention.head_count"),
                  num_key_value_heads=f("attention.head_count_kv"), rms_norm_eps=f("attention.layer_norm_rms_epsilon"),
                  max_position_embeddings=positions, rope_theta=f("rope.freq_base"), rope_scaling=scaling,
                  intermediate_size=f("feed_forward_length"),
                  tie_word_embeddings=all(t.name != "output.weight" for t in reader.tensors), torch_dtype="float32")
    config = (transformers.LlamaConfig if arch == "llama" else transformers.Qwen2Config)(**common)
    return transformers.AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, config=config, torch_dtype=torch.float32).eval()


if __name__ == "__main__":
    sys.exit(fixture_main(__doc__, {name: args for name, (args, _, _) in MODELS.items()}, reference))
