"""The CPU's expanded weights kept on disk, for the next start of the same model to read instead of expand.

On the CPU every matrix is expanded from its GGUF blocks to float32 at load (engine/model/weights.py
host_matrix): about a second for the default model, most of an engine's start. With
$STRATA_CPU_WEIGHT_CACHE set to a folder, each expanded matrix is written there once (a `.npy`, its
column-major layout kept) and later starts read it (from the page cache, mostly: a copy, not the
expansion's arithmetic). Read, not mapped: the decode steps' GEMVs over a file's mapping ran ~25% slower
(over the start's plain 4 KiB pages about 2%: engine/ops/host_pages.py). The values are the expansion's,
bit for bit. Off by default: the folder takes 4 bytes a weight (8x a 4-bit file).
A file is named after what its values depend on: the model file (its path, size and modification
time), the tensors and their de-interleaving, a tensor-parallel shard's ranges, and this format's
version; a new file is written beside, then renamed into place, so that engines starting together never
read half of one."""
from __future__ import annotations

import contextlib
import hashlib
import os
import sys
from pathlib import Path
from typing import Callable

import numpy as np

ENV = "STRATA_CPU_WEIGHT_CACHE"
VERSION = 1  # of the expansion's layout: a change to host_matrix's output changes it


class ExpandedCache:
    """One model file's expanded matrices in `folder`."""

    def __init__(self, folder: str | Path, model_path: str, shard: tuple[int, int] | None):
        stat = os.stat(model_path)
        model = f"{VERSION} {os.path.realpath(model_path)} {stat.st_size} {stat.st_mtime_ns} {shard}"
        self.folder = Path(folder) / hashlib.sha256(model.encode()).hexdigest()[:24]
        self.writable = True

    @classmethod
    def from_env(cls, model_path: str, shard: tuple[int, int] | None) -> ExpandedCache | None:
        folder = os.environ.get(ENV)
        return cls(folder, model_path, shard) if folder else None

    def matrix(self, pieces: list, expand: Callable[[list], np.ndarray]) -> np.ndarray:
        """pieces (weights.TensorRows) stacked by expand, or read from the file an earlier start wrote; a
        failed write (a full disk) is said once and the start goes on without the cache."""
        spec = "|".join(f"{p.tensor.name}:{p.heads}:{p.rows}:{p.cols}" for p in pieces)
        path = self.folder / f"{hashlib.sha256(spec.encode()).hexdigest()[:24]}.npy"
        try:
            return np.load(path)
        except (OSError, ValueError):  # none yet, or unreadable: expanded again
            pass
        values = expand(pieces)
        if self.writable:
            self.write(path, values)
        return values

    def write(self, path: Path, values: np.ndarray) -> None:
        partial = path.with_suffix(f".{os.getpid()}.partial")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(partial, "wb") as f:
                np.save(f, values)
            os.replace(partial, path)
        except OSError as e:
            self.writable = False
            with contextlib.suppress(OSError):
                partial.unlink()
            print(f"strata: the expanded weights are not kept in {self.folder} ({e}); this start goes on "
                  "without them", file=sys.stderr, flush=True)
