"""The weights' upload through pinned buffers (engine/ops/upload.py) against plain cupy.asarray, on one
model file: load_model both ways, alternating, each load's seconds (medians), and every weight of the
two loads equal bit for bit; then pieces stacked (Q's and K's rows) and strided pieces (a column slice, Q's de-interleaved
rows) against cupy.asarray of their NumPy concatenation.

    python tools/device/upload_check.py --model PATH [--repeats 2] [--json OUT]

Exit status 0 when every weight and piece is equal.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import fields, is_dataclass, replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from engine.core.quantized import QuantMatrix  # noqa: E402
from engine.kernels.model_parts import ModelKernels  # noqa: E402
from engine.model.weights import TensorRows, deinterleave_heads, load_model  # noqa: E402
from engine.modelfile.gguf_file import GGUFFile  # noqa: E402
from engine.modelfile.model_config import read_config  # noqa: E402
from engine.ops.backend import select_backend  # noqa: E402
from engine.ops.upload import PinnedUpload  # noqa: E402


def arrays(w, where: str = "weights"):
    """(where, device array) for every array in Weights, its layers, QuantMatrix parts and experts."""
    if isinstance(w, QuantMatrix):
        for i, p in enumerate(w.parts):
            yield f"{where}.part{i}({p.kind})", p.data
    elif isinstance(w, list):
        for i, x in enumerate(w):
            yield from arrays(x, f"{where}[{i}]")
    elif is_dataclass(w):
        for f in fields(w):
            yield from arrays(getattr(w, f.name), f"{where}.{f.name}")
    elif w is not None and hasattr(w, "shape"):
        yield where, w


def timed_load(path: str, backend) -> tuple[float, object]:
    backend.synchronize()
    start = time.monotonic()
    _, weights, _ = load_model(path, backend)
    backend.synchronize()
    return time.monotonic() - start, weights


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--threads", default="4", help="the copy threads of each pinned form timed, e.g. 2,4,8")
    p.add_argument("--json")
    a = p.parse_args()
    reader = GGUFFile(a.model, "r")
    cfg = read_config(reader)
    pinned = select_backend("gpu", ModelKernels.of(cfg, reader))
    cp = pinned.xp
    forms = {f"pinned, {n} threads": replace(pinned, uploader=PinnedUpload(cp, threads=int(n))) for n in a.threads.split(",")}
    forms["plain"] = replace(pinned, uploader=None)
    times: dict[str, list[float]] = {name: [] for name in forms}
    loads = {}
    for _ in range(a.repeats):
        for name, backend in forms.items():
            loads.pop(name, None)
            cp.get_default_memory_pool().free_all_blocks()
            seconds, loads[name] = timed_load(a.model, backend)
            times[name].append(seconds)
            print(f"{name}: {seconds:.2f} s", flush=True)
    compared, differ = 0, []
    for (where, x), (_, y) in zip(arrays(loads[next(iter(forms))]), arrays(loads["plain"]), strict=True):
        compared += int(x.nbytes)
        if x.shape != y.shape or x.dtype != y.dtype or not bool(cp.array_equal(x, y)):
            differ.append(where)
    loads.clear()

    tensors = {t.name: t for t in reader.tensors}
    q, k = (TensorRows(tensors[f"blk.0.attn_{x}.weight"]).raw() for x in "qk")  # one kind (v may differ)
    pieces = {"q, k stacked": [q, k], "a column slice": [q[:, : q.shape[1] // 2]],
              "q de-interleaved": [deinterleave_heads(q, cfg.n_heads)], "token_embd": [TensorRows(tensors["token_embd.weight"]).raw()]}
    for name, ps in pieces.items():
        want = cp.asarray(np.concatenate(ps) if len(ps) > 1 else np.ascontiguousarray(ps[0]))
        got = pinned.upload_rows(ps)
        pinned.finish_uploads()
        if not bool(cp.array_equal(want, got)):
            differ.append(name)
    report = {"model": a.model, "bytes": compared, "seconds": times,
              "median_s": {n: statistics.median(t) for n, t in times.items()},
              "gb_per_s": {n: compared / statistics.median(t) / 1e9 for n, t in times.items()},
              "pieces_checked": list(pieces), "differ": differ}
    print(json.dumps(report, indent=1))
    if a.json:
        Path(a.json).write_text(json.dumps(report, indent=1) + "\n")
    print("upload: ALL EQUAL" if not differ else f"UPLOAD DIFFERS: {differ}")
    return 0 if not differ else 1


if __name__ == "__main__":
    sys.exit(main())
