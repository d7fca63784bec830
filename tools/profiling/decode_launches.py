"""How many kernels one decode step launches, by kernel, on the CPU: the engine's GPU backend with its CUDA
sources run on the host (tests/engine/kernels/host_gpu.py), a model's decode step taken eagerly (a decode graph
replays the same launches). One request's decode of a hybrid MoE is bound by its launches' latency (~800 of
them a token for the Qwen3-Next-80B-A3B shape, ~10 us each), so the count is the figure a kernel fusion moves,
before a GPU times it. The layers' kinds repeat: a small fixture of the family gives the count per layer.

    python tools/profiling/decode_launches.py [GGUF] [--rows N] [--json OUT]

GGUF: a file of weight types the host builds (default: the qwen3next fixture of tests/fixtures/hybrid).
"""
from __future__ import annotations

import argparse
import collections
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from engine.kernels.model_parts import ModelKernels  # noqa: E402
from engine.kvcache.recurrent import SequenceState  # noqa: E402
from engine.model.weights import load_model  # noqa: E402
from engine.modelfile.gguf_file import GGUFFile  # noqa: E402
from engine.modelfile.model_config import read_config  # noqa: E402
from engine.runner.runner import ModelRunner  # noqa: E402
from tests.engine.kernels.host_gpu import host_gpu_backend  # noqa: E402
from tests.engine.kernels.hybrid_reference import FIXTURES, GOLDEN  # noqa: E402

PROMPT = 8  # positions read before the decode step


def counted(launch, name: str, counts: collections.Counter):
    """launch, each call counted under name."""
    def run(*args, **kwargs):
        counts[name] += 1
        return launch(*args, **kwargs)
    return run


def count_launches(path: str, rows: int, workdir: Path) -> dict:
    """The launches, by kernel name, of one decode step of `rows` requests (each after an 8-token read)."""
    reader = GGUFFile(path, "r")
    cfg = read_config(reader)
    backend = host_gpu_backend(ModelKernels.of(cfg, reader), workdir)
    cfg, weights, _ = load_model(path, backend, reader=reader)
    runner = ModelRunner(cfg, weights, backend, ctx=512, chunk=64, eos_ids=frozenset(), max_running=max(2, rows),
                         cuda_graphs=False)
    tables, states = [], []
    for r in range(rows):
        tables.append(runner.pool.allocate(runner.pool.blocks_for(PROMPT + 1)))
        states.append(None if runner.recurrent is None else SequenceState.fresh(runner.recurrent))
        runner.forward(np.arange(PROMPT, dtype=np.int64) + r, 0, tables[-1], want_logits=True, state=states[-1])
    counts: collections.Counter = collections.Counter()
    kernels = backend.ops.kernels  # (its MoE launcher holds the same dict of kernels)
    kernels.fn.update({name: counted(launch, name, counts) for name, launch in kernels.fn.items()})
    runner.decode_logits([1] * rows, tables, [PROMPT] * rows, [s for s in states if s is not None])
    return {"model": Path(path).name, "architecture": cfg.arch,
            "layers": cfg.n_layers, "rows": rows, "launches": sum(counts.values()),
            "by_kernel": dict(counts.most_common())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("gguf", nargs="?", default=str(FIXTURES / GOLDEN["models"]["qwen3next"]["file"]))
    ap.add_argument("--rows", type=int, default=1, help="requests in the decode step")
    ap.add_argument("--json", help="write the counts here too")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as work:
        result = count_launches(args.gguf, args.rows, Path(work))
    print(f"{result['model']} ({result['architecture']}, {result['layers']} layers), {result['rows']} row(s): "
          f"{result['launches']} launches a decode step")
    for name, n in result["by_kernel"].items():
        print(f"{n:6d}  {name}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
