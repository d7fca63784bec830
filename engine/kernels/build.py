"""The kernels' compilation: each .cu file (the big ones in parts, parts.cuh) compiled by NVRTC through
CuPy, whose disk cache (~/.cupy/kernel_cache, $CUPY_CACHE_DIR) keeps the result for every later start.

A first start on a fresh machine used to compile the files one after another in the engine (about 100 s
on an H200 host, the server silent all the while). Here the parts not yet in the cache are compiled by
worker processes side by side, one a core, with a line of progress as each finishes, the Hopper prompt
attention's cubin among them (SM90, cached by sm90.py); then the engine loads every part from the cache.
The engine asks only for the parts its model needs (model_parts.py). `make setup` builds every part on a
machine with an NVIDIA GPU (`python -m engine.kernels`), so that the first `make serve` finds them built.
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

from engine.kernels import sm90
from engine.kernels.sources import OPTIONS, kernel_source

PARTS = {"quant.cu": 30, "mmq.cu": 15, "attention.cu": 21}  # the parts each file's IN_PART lines make (the rest: one)


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


SM90 = Unit("attention_sm90.cu")  # compiled for sm_90a into sm90.py's cache, not CuPy's


def units(sources) -> list[Unit]:
    """Every compilation of these kernel files, the slowest (most parts' files) first."""
    ordered = sorted(sources, key=lambda s: -PARTS.get(s, 1))
    return [Unit(s, i, PARTS.get(s, 1)) for s in ordered for i in range(PARTS.get(s, 1))]


def module(cp: ModuleType, unit: Unit, defines: tuple[str, ...]):
    """The unit's RawModule (compiled, or read from CuPy's cache, at its first get_function)."""
    return cp.RawModule(code=kernel_source(unit.source), options=unit.options(defines))


def compile_unit(unit: Unit, defines: tuple[str, ...]) -> float:
    """A worker's job: the unit compiled into CuPy's disk cache (SM90: into sm90.py's); returns the
    seconds it took."""
    import cupy as cp

    began = time.monotonic()
    if unit == SM90:
        try:
            sm90.cubin(cp, kernel_source(unit.source), unit.source, unit.options(defines))
        except RuntimeError:  # an NVRTC older than CUDA 12: the engine's load_sm90 says so, and runs mma.sync
            pass
    else:
        module(cp, unit, defines).compile()
    return time.monotonic() - began


def stamp_path(cp: ModuleType, unit: Unit, defines: tuple[str, ...]) -> Path:
    """A file in CuPy's cache folder named after everything a unit's build depends on (its source as
    compiled, the options, the device's architecture, CuPy's and the CUDA runtime's versions): there, the
    unit is in the cache (CuPy's, or sm90.py's for SM90)."""
    h = hashlib.sha256()
    arch = cp.cuda.Device().compute_capability
    h.update(f"{cp.__version__} {cp.cuda.runtime.runtimeGetVersion()} {arch} {defines}".encode())
    h.update(kernel_source(unit.source).encode())
    h.update(" ".join(unit.options(defines)).encode())
    folder = Path(os.environ.get("CUPY_CACHE_DIR") or Path.home() / ".cupy" / "kernel_cache")
    return folder / f"strata-{h.hexdigest()[:20]}.built"


def log(text: str) -> None:
    print(f"strata: {text}", file=sys.stderr, flush=True)


CONTEXT_BYTES = 1 << 30  # device memory a compiler process's CUDA context may take (a few hundred MiB, rounded up)


def workers_beside(cp: ModuleType) -> int:
    """Compiler processes the device's free memory has room for beside a running engine (whose KV pool holds most
    of the card: each process's CUDA context would find none), one a core at most; 0: compile in this process."""
    free = cp.cuda.runtime.memGetInfo()[0]
    return min(os.cpu_count() or 1, free // CONTEXT_BYTES)


def prebuild(cp: ModuleType, todo: list[Unit], defines: tuple[str, ...] = (), workers: int | None = None) -> None:
    """These units in the cache, those whose stamp is missing compiled side by side, `workers` processes (None: one
    a core; 0: one after another in this process, whose CUDA context exists already) (none: nothing is done, and a
    later start pays nothing; a build cut short keeps the units it finished)."""
    stamps = {unit: stamp_path(cp, unit, defines) for unit in todo}
    todo = [unit for unit in todo if not stamps[unit].exists()]
    if not todo:
        return
    began = time.monotonic()

    def finished(done: int, unit: Unit, seconds: float) -> None:
        stamps[unit].parent.mkdir(parents=True, exist_ok=True)
        stamps[unit].write_text(f"{unit.describe()} compiled in {seconds:.1f} s\n")
        log(f"  compiled {unit.describe()} in {seconds:.1f} s ({done}/{len(todo)}, "
            f"{time.monotonic() - began:.0f} s so far)")

    if workers == 0:
        log(f"compiling {len(todo)} parts in the engine's process (no device memory for more compilers)")
        for done, unit in enumerate(todo, 1):
            finished(done, unit, compile_unit(unit, defines))
        return
    workers = min(len(todo), workers or os.cpu_count() or 1)
    log(f"compiling the GPU kernels for this device: {len(todo)} parts on {workers} cores "
        "(once; later starts read them from the cache)")
    with ProcessPoolExecutor(workers, mp_context=get_context("spawn")) as pool:
        jobs = {pool.submit(compile_unit, unit, defines): unit for unit in todo}
        for done, job in enumerate(as_completed(jobs), 1):
            finished(done, jobs[job], job.result())
    log(f"GPU kernels compiled in {time.monotonic() - began:.1f} s")
