"""CUDA kernels run on the CPU, one thread at a time: a kernel file of engine/kernels compiled by the host's C++
compiler with the CUDA names it uses defined for the host (`SHIM`), each kernel called through ctypes once per
(block, thread) with blockIdx and threadIdx set. Only kernels whose threads do not talk to each other (no shared
memory, shuffles or barriers) can run so: linear_attention.cu's are written that way. It checks a kernel's
indexing and arithmetic against its NumPy reference before a GPU is at hand; a GPU still checks the rest."""
from __future__ import annotations

import ctypes
import itertools
import shutil
import subprocess
from pathlib import Path

import numpy as np

from engine.kernels.sources import kernel_source

SHIM = Path(__file__).with_name("cuda_host.h")  # the CUDA names, defined for the host
SCALARS = {np.dtype(np.int32): ctypes.c_int32, np.dtype(np.int64): ctypes.c_int64, np.dtype(np.float32): ctypes.c_float}


def compiler() -> str | None:
    return shutil.which("g++") or shutil.which("c++")


def host_library(name: str, workdir: Path, extra: str = "") -> ctypes.CDLL:
    """engine/kernels' file `name` (its local headers pasted in) and `extra` (host code calling into it), compiled
    for the host with cuda_host.h, loaded."""
    source = kernel_source(name).replace("#include <cuda_fp16.h>", "")
    cpp, lib = workdir / f"{Path(name).stem}.cpp", workdir / f"{Path(name).stem}.so"
    cpp.write_text(f'#include "{SHIM}"\n' + source + extra)
    built = subprocess.run([compiler(), "-std=c++17", "-O1", "-shared", "-fPIC", "-o", str(lib), str(cpp)],
                           capture_output=True, text=True)
    assert built.returncode == 0, built.stderr[-3000:]
    return ctypes.CDLL(str(lib))


class HostKernels(dict):
    """A kernel file's kernels by name, each called as GpuKernels' fn entries are: fn(grid, block, args), with
    NumPy arrays for device arrays (their addresses passed) and NumPy scalars."""

    def __init__(self, name: str, workdir: Path):
        self.lib = host_library(name, workdir)
        super().__init__()

    def __missing__(self, name: str):
        fn = getattr(self.lib, name)
        fn.restype = None
        self[name] = lambda grid, block, args: self.launch(fn, grid, block, args)
        return self[name]

    def launch(self, fn, grid, block, args) -> None:
        grid, block = (tuple(g) + (1,) * (3 - len(g)) for g in (grid, block))
        values = [argument(a) for a in args]
        for bz, by, bx in itertools.product(*(range(g) for g in reversed(grid))):
            for tz, ty, tx in itertools.product(*(range(b) for b in reversed(block))):
                self.lib.host_set_ids(bx, by, bz, tx, ty, tz, *grid, *block)
                fn(*values)


def argument(a):
    if isinstance(a, np.ndarray):
        assert a.flags.c_contiguous, "a kernel's array argument must be contiguous"
        return ctypes.c_void_p(a.ctypes.data)
    if isinstance(a, np.generic) and a.dtype in SCALARS:
        return SCALARS[a.dtype](a.item())
    raise TypeError(f"a host kernel takes NumPy arrays and NumPy scalars, not {type(a).__name__}")
