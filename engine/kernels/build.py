"""The kernels' compilation: each .cu file (the big ones in parts, parts.cuh) compiled by NVRTC through
CuPy, whose disk cache (~/.cupy/kernel_cache, $CUPY_CACHE_DIR) keeps the result for every later start.

A first start on a fresh machine used to compile the files one after another in the engine (about 100 s
on an H200 host, the server silent all the while). Here the parts not yet in the cache are compiled by
worker processes side by side, one a core, with a line of progress as each finishes; then the engine
loads every part from the cache. `make setup` runs the same on a machine with an NVIDIA GPU
(`python -m engine.kernels`), so that the first `make serve` finds them built.
"""
from __future__ import annotations

import hashlib
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path
from types import ModuleType

from engine.kernels.sources import OPTIONS, kernel_source

PARTS = {"quant.cu": 8, "mmq.cu": 8, "attention.cu": 4}  # IN_PART lines in each file (the rest: one part)


@dataclass(frozen=True)
class Unit:
    """One compilation: a kernel file, or part `part` of `parts` of it."""

    source: str
    part: int = 0
    parts: int = 1

    def options(self, defines: tuple[str, ...]) -> tuple[str, ...]:
        split = (f"-DPARTS={self.parts}", f"-DPART={self.part}") if self.parts > 1 else ()
        return OPTIONS + tuple(f"-D{d}" for d in defines) + split

    def describe(self) -> str:
        return self.source if self.parts == 1 else f"{self.source} part {self.part + 1}/{self.parts}"


def units(sources) -> list[Unit]:
    """Every compilation of these kernel files, the slowest (most parts' files) first."""
    ordered = sorted(sources, key=lambda s: -PARTS.get(s, 1))
    return [Unit(s, i, PARTS.get(s, 1)) for s in ordered for i in range(PARTS.get(s, 1))]


def module(cp: ModuleType, unit: Unit, defines: tuple[str, ...]):
    """The unit's RawModule (compiled, or read from CuPy's cache, at its first get_function)."""
    return cp.RawModule(code=kernel_source(unit.source), options=unit.options(defines))


def compile_unit(unit: Unit, defines: tuple[str, ...]) -> float:
    """A worker's job: the unit compiled into CuPy's disk cache; returns the seconds it took."""
    import cupy as cp

    began = time.monotonic()
    module(cp, unit, defines).compile()
    return time.monotonic() - began


def stamp_path(cp: ModuleType, sources, defines: tuple[str, ...]) -> Path:
    """A file in CuPy's cache folder named after everything a build depends on (the sources as
    compiled, the options, the device's architecture, CuPy's and the CUDA runtime's versions): there,
    every unit of this build is in the cache."""
    h = hashlib.sha256()
    arch = cp.cuda.Device().compute_capability
    h.update(f"{cp.__version__} {cp.cuda.runtime.runtimeGetVersion()} {arch} {defines}".encode())
    for unit in units(sources):
        h.update(kernel_source(unit.source).encode())
        h.update(" ".join(unit.options(defines)).encode())
    folder = Path(os.environ.get("CUPY_CACHE_DIR") or Path.home() / ".cupy" / "kernel_cache")
    return folder / f"strata-{h.hexdigest()[:20]}.built"


def log(text: str) -> None:
    print(f"strata: {text}", file=sys.stderr, flush=True)


def prebuild(cp: ModuleType, sources, defines: tuple[str, ...] = (), workers: int | None = None) -> None:
    """Every unit of these files in CuPy's cache, compiled side by side unless this build's stamp
    says they are there already (then nothing is done: a later start pays nothing)."""
    stamp = stamp_path(cp, sources, defines)
    if stamp.exists():
        return
    todo = units(sources)
    workers = min(len(todo), workers or os.cpu_count() or 1)
    log(f"compiling the GPU kernels for this device: {len(todo)} parts on {workers} cores "
        "(once; later starts read them from the cache)")
    began = time.monotonic()
    with ProcessPoolExecutor(workers, mp_context=get_context("spawn")) as pool:
        jobs = {pool.submit(compile_unit, unit, defines): unit for unit in todo}
        for done, job in enumerate(as_completed(jobs), 1):
            seconds = job.result()
            log(f"  compiled {jobs[job].describe()} in {seconds:.1f} s ({done}/{len(todo)}, "
                f"{time.monotonic() - began:.0f} s so far)")
    stamp.parent.mkdir(parents=True, exist_ok=True)
    stamp.write_text(f"{len(todo)} parts compiled in {time.monotonic() - began:.1f} s\n")
    log(f"GPU kernels compiled in {time.monotonic() - began:.1f} s")
