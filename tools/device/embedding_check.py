"""Embeddings (GEN embed=1, engine/runner/pooling.py) on a device, against transformers' vectors of the tiny
Qwen3 embedding fixture (tests/fixtures/embedding/, tools/fixtures/make_embedding_fixture.py): for each
pooling, every prompt's vector alone (its largest difference from the reference, absolute and relative to
the vector's largest value), and whether it is the same bits read beside other reads and a decoder and
parked and resumed. The CPU's run is tests/engine/model/test_embeddings.py; this is the GPU's:

    python3 tools/device/embedding_check.py --device gpu [--chunk 64 --step-tokens 96] > embedding_gpu.json
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from protocol import messages as m  # noqa: E402
from tests.harness import PY, EngineProcess  # noqa: E402

FIXTURES = ROOT / "tests/fixtures/embedding"


def vector(lines, ident: int) -> np.ndarray:
    return np.array(next(x.vector for x in lines if isinstance(x, m.Embedding) and x.id == ident), dtype=np.float32)


def alone(e: EngineProcess, ids, ident: int = 1) -> np.ndarray:
    e.send(m.Gen(1, tuple(ids), {"embed": 1, "reuse": 0}, ident))
    return vector(e.read_until(m.Done, ident=ident), ident)


def check(pooling: str, cases: list[dict], a: argparse.Namespace) -> dict:
    e = EngineProcess([PY, "-m", "engine", "--serve", "--device", a.device, "--model", str(FIXTURES / "qwen3-embedding.gguf"),
                       "--ctx", "512", "--chunk", str(a.chunk), "--step-tokens", str(a.step_tokens), "--max-running", "8",
                       "--prefill-preempt-min-tokens", "0", "--pooling", pooling])
    try:
        e.handshake()
        vectors = [alone(e, case["ids"]) for case in cases]
        errors = [np.abs(v - np.asarray(c[pooling])) for v, c in zip(vectors, cases)]
        # all at once behind another request's long read, then beside its decoding
        e.send(m.Gen(30, tuple(range(1000, 1200)), {"temperature": 0.0, "reuse": 0}, 50))
        for i, case in reversed(list(enumerate(cases))):
            e.send(m.Gen(1, tuple(case["ids"]), {"embed": 1, "reuse": 0}, 10 + i))
        seen: list = []
        for ident in (50, *range(10, 10 + len(cases))):
            if not any(isinstance(x, m.Done) and x.id == ident for x in seen):
                seen += e.read_until(m.Done, ident=ident)
        shared = [bool(np.array_equal(vector(seen, 10 + i), v)) for i, v in enumerate(vectors)]
        e.send(m.Gen(1, tuple(cases[-1]["ids"]), {"embed": 1, "reuse": 0}, 2))  # parked after its first chunk
        got = e.read_until(m.PromptProgress, ident=2)
        e.send(m.Yield())
        got += e.read_until(m.Suspended, ident=2)
        e.send(m.Gen(2, (9, 8, 7, 6), {"temperature": 0.0}, 3))
        e.read_until(m.Done, ident=3)
        e.send(m.Resume(2))
        got += e.read_until(m.Done, ident=2)
        return {"shape_free": e.info.get("shape_free"), "device": e.info.get("device"),
                "max_abs": [float(err.max()) for err in errors],
                "max_rel": [float(err.max() / np.abs(c[pooling]).max()) for err, c in zip(errors, cases)],
                "same_bits_shared": shared, "same_bits_parked": bool(np.array_equal(vector(got, 2), vectors[-1]))}
    finally:
        e.close()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="gpu")
    p.add_argument("--chunk", type=int, default=64)
    p.add_argument("--step-tokens", type=int, default=96)
    a = p.parse_args()
    cases = json.loads((FIXTURES / "embedding_golden.json").read_text())["cases"]
    out = {pooling: check(pooling, cases, a) for pooling in ("last", "mean", "cls")}
    print(json.dumps(out, indent=1))
    ok = all(all(r["same_bits_shared"]) and r["same_bits_parked"] for r in out.values())
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
