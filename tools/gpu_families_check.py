"""The model families beside llama on the GPU (CuPy, half precision) against the transformers
reference of tests/fixtures/arch_golden.json: the tiny GGUFs are made again (same bytes as the
fixture's), read on the GPU with eager forwards and with the decode graphs, and compared: top ids,
logits (fp16 tolerance), greedy continuations, MoE routes.

    python tools/gpu_families_check.py [--json OUT]
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

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from engine.backend import select_backend  # noqa: E402
from engine.decode_graph import GraphDecoder  # noqa: E402
from engine.gguf_model import load_model  # noqa: E402
from engine.kv import KVCache  # noqa: E402
from engine.model import LlamaModel  # noqa: E402

FIXTURE = json.loads((ROOT / "tests/fixtures/arch_golden.json").read_text())["models"]


def check(path: Path, spec: dict, backend, graphs: bool) -> list[dict]:
    cfg, weights, _ = load_model(str(path), backend)
    model = LlamaModel(cfg, weights, backend)
    rows = []
    for case in spec["cases"]:
        kv = KVCache(cfg, 256, backend)
        model.route_log = []
        logits = model.prefill(np.asarray(case["ids"]), kv, 512)
        routes, model.route_log = model.route_log, None
        decoder = GraphDecoder(model, kv, backend) if graphs else None
        out, cur = [], logits
        for _ in range(len(case["greedy"])):
            out.append(int(np.argmax(cur)))
            pos = len(case["ids"]) + len(out) - 1
            cur = (backend.to_host(decoder.decode(out[-1], pos)) if decoder else
                   model.forward(np.asarray(out[-1:]), pos, kv, want_logits=True))
        row = {"tokens": len(case["ids"]),
               "top_ids_equal": [int(i) for i in np.argsort(-logits, kind="stable")[:5]] == case["top_ids"][:5],
               "max_abs_diff": float(max(np.max(np.abs(logits[case["top_ids"]] - case["top_logits"])),
                                         np.max(np.abs(logits[spec["probe_ids"]] - case["probe_logits"])))),
               "greedy_equal": out == case["greedy"]}
        if "routes" in case:
            row["routes_equal"] = all(e.tolist() == r["experts"] for (_, e, _), r in zip(routes, case["routes"]))
        rows.append(row)
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--json")
    p.add_argument("--tokenizer", help="GGUF with the default model's tokenizer (where the default model is not installed)")
    a = p.parse_args()
    backend = select_backend("gpu")
    result = {}
    with tempfile.TemporaryDirectory() as folder:
        for family, spec in FIXTURE.items():
            path = Path(folder) / f"{family}.gguf"
            subprocess.run([sys.executable, str(ROOT / "tools/make_synthetic_gguf.py"), str(path), *spec["args"],
                            *(["--tokenizer", a.tokenizer] if a.tokenizer else [])], check=True, capture_output=True)
            same_file = hashlib.sha256(path.read_bytes()).hexdigest() == spec["sha256"]
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
