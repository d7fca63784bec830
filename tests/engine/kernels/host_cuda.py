"""CUDA kernels run on the CPU: a kernel file of engine/kernels compiled by the host's C++ compiler with the CUDA
names it uses defined for the host (cuda_host.h), each block's threads run as fibers that meet at the block's and
the warps' barriers (__syncthreads, __syncwarp, shuffles), shared memory as the block's own. It checks a kernel's
indexing, cooperation and arithmetic against its NumPy reference before a GPU is at hand; what it cannot run
(tensor-core PTX, timing, the memory model's races) a GPU still checks. Arithmetic follows the C++ compiler's
float rules, so a check compares against a tolerance or against the same kernel's other runs, not against a
GPU's bits."""
from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import numpy as np

from engine.kernels.sources import kernel_source
from tools.fixtures.fetch_fixture import cache_dir

HEADER = Path(__file__).with_name("cuda_host.h")
SCALARS = {np.dtype(np.int32): ctypes.c_int32, np.dtype(np.int64): ctypes.c_int64, np.dtype(np.float32): ctypes.c_float,
           np.dtype(np.uint32): ctypes.c_uint32, np.dtype(np.uint64): ctypes.c_uint64,
           np.dtype(np.float64): ctypes.c_double}
DYNAMIC_SHARED = re.compile(r"extern __shared__ (?:__align__\(\d+\) )?([\w:]+) (\w+)\[\];")


def compiler() -> str | None:
    return shutil.which("g++") or shutil.which("c++")


def host_source(name: str) -> str:
    """engine/kernels' file `name` with its local headers pasted in, as the host compiles it: no cuda_fp16.h, the
    dynamic shared memory the launch's own buffer."""
    source = kernel_source(name).replace("#include <cuda_fp16.h>", "")
    return DYNAMIC_SHARED.sub(r"\1* \2 = reinterpret_cast<\1*>(host_grid::arena);", source)


def without_launch_bounds(text: str) -> str:
    while (at := text.find("__launch_bounds__")) >= 0:
        depth, end = 0, text.index("(", at)
        for end in range(end, len(text)):
            depth += {"(": 1, ")": -1}.get(text[end], 0)
            if depth == 0:
                break
        text = text[:at] + text[end + 1:]
    return text


@functools.lru_cache(maxsize=None)
def kernels_in(name: str, defines: tuple[str, ...] = ()) -> frozenset[str]:
    """The extern "C" kernels of engine/kernels' file `name` as compiled with -D `defines` (a file's part): its
    source preprocessed, as NVRTC sees it, by the C preprocessor."""
    source = "\n".join(line for line in kernel_source(name).splitlines() if not line.startswith("#include <"))
    text = subprocess.run(["cpp", "-P", *(f"-D{d}" for d in defines)], input=source, capture_output=True, text=True,
                          check=True).stdout
    return frozenset(re.findall(r'extern "C"\s+__global__\s+void\s+(\w+)\s*\(', without_launch_bounds(text)))


def host_library(name: str, workdir: Path, kernels: tuple[str, ...] = (), extra: str = "",
                 defines: tuple[str, ...] = ()) -> ctypes.CDLL:
    """`name` compiled for the host with cuda_host.h (and -D `defines`: a file's part), a launch_<kernel> entry for
    each of `kernels` and every other kernel the file (part) holds, and `extra` (host code calling into it), loaded;
    compiled once for all that make it the same (built_dir), in workdir: a part compiles once whichever of its
    kernels a test asks for (they asked for different ones, and the same part compiled two or three times)."""
    every = sorted(set(kernels) | (kernels_in(name, defines) if kernels else set()))
    wrappers = "".join(f'\nextern "C" void launch_{k}(const unsigned* dims, void** args) '
                       f"{{ host_grid::launch_kernel(&{k}, dims, args); }}" for k in every)
    source = host_source(name) + wrappers + "\n" + extra
    flags = ["-std=c++17", "-O1", "-shared", "-fPIC", *(f"-D{d}" for d in defines)]
    key = hashlib.sha256("\0".join([compiler_identity(), HEADER.read_text(), source, *flags]).encode()).hexdigest()
    kept = built_dir() / f"{Path(name).stem}-{key[:32]}.so"
    if kept.exists():
        os.utime(kept)  # (in use: keep_library prunes the ones unused for a month)
        return ctypes.CDLL(str(kept))
    cpp, lib = workdir / f"{Path(name).stem}.cpp", workdir / f"{Path(name).stem}.so"
    cpp.write_text(f'#include "{HEADER}"\n' + source)
    built = subprocess.run([compiler(), *flags, "-o", str(lib), str(cpp)], capture_output=True, text=True)
    assert built.returncode == 0, built.stderr[-3000:]
    keep_library(lib, kept)
    return ctypes.CDLL(str(kept))


def built_dir() -> Path:
    """Where compiled host libraries are kept, by the hash of all that makes them: $STRATA_CACHE/host_kernels, else
    ~/.cache/strata/host_kernels (the fixtures' cache). A kernel file compiled once serves every test, worker and
    checkout that compiles the same source with the same flags and compiler; a change to any of them is a new key."""
    return cache_dir() / "host_kernels"


@functools.lru_cache(maxsize=1)
def compiler_identity() -> str:
    return compiler() + subprocess.run([compiler(), "--version"], capture_output=True, text=True).stdout


def keep_library(lib: Path, kept: Path, month_s: float = 30 * 86400) -> None:
    """lib into the cache as `kept` (written beside it, then renamed: workers compiling the same one race
    harmlessly), and the cache's libraries unused for a month removed."""
    kept.parent.mkdir(parents=True, exist_ok=True)
    partial = kept.with_name(f"{kept.name}.{os.getpid()}.partial")
    shutil.copyfile(lib, partial)
    os.replace(partial, kept)
    for old in kept.parent.glob("*.so"):
        try:
            if time.time() - old.stat().st_mtime > month_s:
                old.unlink()
        except OSError:  # (another worker's prune got it first)
            pass


class HostKernels(dict):
    """A kernel file's kernels by name, each called as GpuKernels' fn entries are: fn(grid, block, args,
    shared_mem=0), with NumPy arrays for device arrays (their addresses passed) and NumPy scalars."""

    def __init__(self, name: str, workdir: Path, kernels: tuple[str, ...], defines: tuple[str, ...] = ()):
        super().__init__()
        lib = host_library(name, workdir, kernels, defines=defines)
        for k in kernels:
            self[k] = Launch(getattr(lib, f"launch_{k}"))


class Launch:
    def __init__(self, entry):
        self.entry = entry
        entry.restype = None

    def __call__(self, grid, block, args, shared_mem: int = 0) -> None:
        grid, block = (tuple(int(v) for v in g) + (1,) * (3 - len(g)) for g in (grid, block))
        dims = (ctypes.c_uint * 7)(*grid, *block, shared_mem)
        values = [argument(a) for a in args]
        pointers = (ctypes.c_void_p * max(1, len(values)))(*(ctypes.cast(ctypes.pointer(v), ctypes.c_void_p)
                                                            for v in values))
        self.entry(dims, pointers)


def argument(a):
    if isinstance(a, np.ndarray):  # (a view passes its first element's address, as CuPy's does)
        return ctypes.c_void_p(a.ctypes.data)
    if isinstance(a, np.generic) and a.dtype in SCALARS:
        return SCALARS[a.dtype](a.item())
    if a is None:  # a null pointer (engine/kernels/args.py NULL)
        return ctypes.c_void_p(0)
    raise TypeError(f"a host kernel takes NumPy arrays and NumPy scalars, not {type(a).__name__}")


def q8_values(units: np.ndarray) -> np.ndarray:
    """Q8 units (q8.cuh: (units, 48) bytes, 32 int8 then d and the sums as float32) -> the values they stand for,
    q * d (units * 32,) float32: what engine.core.quantized.quantize_q8 gives of the row they were made from."""
    units = np.ascontiguousarray(units).reshape(-1, 48)
    return (units[:, :32].view(np.int8) * units[:, 32:36].copy().view(np.float32)).reshape(-1)
