"""The model families beside llama on the GPU (CuPy, half precision) against the transformers
reference of tests/fixtures/arch_golden.json, and rope scaling (Llama 3.1's factors, YaRN) against
that of tests/fixtures/rope_golden.json, at positions past the original context: the tiny GGUFs are made again (same bytes as the
fixture's), read on the GPU with eager forwards and with the decode graphs, and compared: top ids,
logits (fp16 tolerance), greedy continuations, MoE routes. The qwen3moe model is also made in Q8_0
(its experts then stay in blocks on the GPU) and compared with the NumPy engine on that file.

    python tools/device/gpu_families_check.py [--json OUT]
"""
from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from engine.ops.backend import select_backend  # noqa: E402
from engine.runner.decode_graph import GraphDecoder  # noqa: E402
from engine.model.weights import load_model  # noqa: E402
from engine.kvcache.kv import KVCache  # noqa: E402
from engine.model.forward import LlamaModel  # noqa: E402

FIXTURE = json.loads((ROOT / "tests/fixtures/arch_golden.json").read_text())["models"]
ROPE = json.loads((ROOT / "tests/fixtures/rope_golden.json").read_text())["models"]


def run(model, backend, ids: list[int], greedy: int, graphs: bool):
    """The prompt's last logits, the routes of its read (MoE), and its greedy continuation."""
    kv = KVCache(model.cfg, 256, backend)
    model.route_log = []
    logits = model.prefill(np.asarray(ids), kv, 512)
    routes, model.route_log = model.route_log, None
    decoder = GraphDecoder(model, kv, backend) if graphs else None
    out, cur = [], logits
    for _ in range(greedy):
        out.append(int(np.argmax(cur)))
        pos = len(ids) + len(out) - 1
        cur = (backend.to_host(decoder.decode_one(out[-1], pos)) if decoder else
               model.forward(np.asarray(out[-1:]), pos, kv, want_logits=True))
    return logits, [e.tolist() for _, e, _ in routes], out


def check(path: Path, spec: dict, backend, graphs: bool) -> list[dict]:
    cfg, weights, _ = load_model(str(path), backend)
    model = LlamaModel(cfg, weights, backend)
    rows = []
    for case in spec["cases"]:
        logits, routes, out = run(model, backend, case["ids"], len(case["greedy"]), graphs)
        row = {"tokens": len(case["ids"]),
               "top_ids_equal": [int(i) for i in np.argsort(-logits, kind="stable")[:5]] == case["top_ids"][:5],
               "max_abs_diff": float(max(np.max(np.abs(logits[case["top_ids"]] - case["top_logits"])),
                                         np.max(np.abs(logits[spec["probe_ids"]] - case["probe_logits"])))),
               "greedy_equal": out == case["greedy"]}
        if "routes" in case:
            row["routes_equal"] = routes == [r["experts"] for r in case["routes"]]
        rows.append(row)
    return rows


def numpy_reference(path: Path, spec: dict) -> dict:
    """The fixture's cases recomputed by the NumPy engine on another file (a quantized one, whose
    values transformers does not read the same way): what the GPU must then reproduce."""
    backend = select_backend("cpu")
    cfg, weights, _ = load_model(str(path), backend)
    model, cases = LlamaModel(cfg, weights, backend), []
    for case in spec["cases"]:
        logits, routes, out = run(model, backend, case["ids"], len(case["greedy"]), False)
        top = [int(i) for i in np.argsort(-logits, kind="stable")[:5]]
        cases.append({"ids": case["ids"], "greedy": out, "top_ids": top, "top_logits": logits[top].tolist(),
                      "probe_logits": logits[spec["probe_ids"]].tolist(),
                      **({"routes": [{"experts": r} for r in routes]} if routes and routes[0] else {})})
    return {**spec, "cases": cases}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--json")
    p.add_argument("--tokenizer", help="GGUF with the default model's tokenizer (where the default model is not installed)")
    a = p.parse_args()
    backend = select_backend("gpu")
    result = {}
    families = [(family, spec, []) for family, spec in FIXTURE.items()]
    families.append(("qwen3moe Q8_0 (vs NumPy)", FIXTURE["qwen3moe"], ["--type", "Q8_0"]))  # experts in blocks
    families += [(f"rope-{name}", spec, []) for name, spec in ROPE.items()]
    with tempfile.TemporaryDirectory() as folder:
        for family, spec, extra in families:
            path = Path(folder) / f"{family.split()[0]}{len(extra)}.gguf"
            subprocess.run([sys.executable, str(ROOT / "tools/fixtures/make_synthetic_gguf.py"), str(path), *spec["args"], *extra,
                            *(["--tokenizer", a.tokenizer] if a.tokenizer else [])], check=True, capture_output=True)
            same_file = hashlib.sha256(path.read_bytes()).hexdigest() == spec["sha256"]
            if extra:
                spec, same_file = numpy_reference(path, spec), None
            for graphs in (False, True):
                try:
                    rows = check(path, spec, backend, graphs)
                except Exception as e:  # report and go on: one family's failure must not hide the others'
                    rows = [{"error": f"{type(e).__name__}: {e}"}]
                key = f"{family} {'graphs' if graphs else 'eager'}"
                result[key] = {"same_file": same_file, "cases": rows}
                print(key, json.dumps(result[key]), flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
