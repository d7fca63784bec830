"""The Hopper-only kernels (attention_sm90.cu, on wgmma). wgmma needs the sm_90a target, which
CuPy's RawModule does not build for (it names the plain compute capability), so this module runs
NVRTC itself through CuPy's binding, keeps the cubin in a cache folder (a restart loads it instead
of compiling again) and loads it as a module. Used only on a device of compute capability 9.0."""
from __future__ import annotations

import hashlib
import importlib
import os
import sys
from pathlib import Path
from types import ModuleType

ARCH = "sm_90a"
MAX_DYNAMIC_SMEM = 8  # CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
ROWS = 128  # query rows per prompt-attention block: BR in attention_sm90.cu
THREADS = 256  # two warpgroups
TILE_KEYS = 128  # BC in attention_sm90.cu
STAGES = 3  # K/V tiles in shared memory: STAGES in attention_sm90.cu


def smem_bytes(d: int) -> int:
    """The Q tile, STAGES stages of K and V tiles, and 1 KiB to align them: Smem<D>::BYTES (225 KiB
    at d = 128, within the 227 KiB a Hopper block may have)."""
    return ROWS * d * 2 + STAGES * 2 * TILE_KEYS * d * 2 + 1024


def supported(cp: ModuleType) -> bool:
    return cp.cuda.Device().compute_capability == "90"


def cache_dir() -> Path:
    return Path(os.environ.get("STRATA_KERNEL_CACHE") or Path.home() / ".cache" / "strata" / "kernels")


def nvrtc_binding(cp: ModuleType) -> ModuleType:
    """CuPy's NVRTC binding (cp: engine/ops/backend.py's): cupy.cuda.nvrtc, or where CuPy 14 keeps it."""
    for name in (f"{cp.__name__}.cuda.nvrtc", "cupy_backends.cuda.libs.nvrtc"):
        try:
            return importlib.import_module(name)
        except ModuleNotFoundError:
            pass
    raise RuntimeError("CuPy's NVRTC binding was not found (cupy.cuda.nvrtc, cupy_backends.cuda.libs.nvrtc)")


def cubin(cp: ModuleType, source: str, name: str, options: tuple[str, ...]) -> bytes:
    """source compiled for sm_90a by NVRTC, from the cache when the same source, options and NVRTC
    built it before. Raises RuntimeError with NVRTC's log when it does not compile."""
    nvrtc = nvrtc_binding(cp)

    options = (*options, f"-arch={ARCH}")
    key = hashlib.sha256("\0".join((source, *options, repr(nvrtc.getVersion()))).encode()).hexdigest()[:32]
    path = cache_dir() / f"{Path(name).stem}-{key}.cubin"
    if path.exists():
        return path.read_bytes()
    prog = nvrtc.createProgram(source, name, (), ())
    try:
        try:
            nvrtc.compileProgram(prog, list(options))
        except nvrtc.NVRTCError as e:
            raise RuntimeError(f"{name} does not compile for {ARCH}: {e}\n{nvrtc.getProgramLog(prog)}") from None
        binary = nvrtc.getCUBIN(prog)
    finally:
        nvrtc.destroyProgram(prog)
    try:  # a cache that cannot be written costs the next start a compile, nothing else
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(f".{os.getpid()}.part")
        partial.write_bytes(binary)
        partial.replace(path)
    except OSError as e:
        print(f"kernel cache {path.parent} not written ({e})", file=sys.stderr)
    return binary


class Sm90Kernels:
    """The sm_90a module and its functions, called as CuPy's RawKernel is: fn[name](grid, block, args, shared_mem=)."""

    def __init__(self, cp: ModuleType, source: str, name: str, kernels: tuple[str, ...], options: tuple[str, ...],
                 smem: dict[str, int]):
        self.module = cp.cuda.function.Module()  # kept: its functions live as long as it does
        self.module.load(cubin(cp, source, name, options))
        self.fn = {k: self.module.get_function(k) for k in kernels}
        for k, nbytes in smem.items():
            cp.cuda.driver.funcSetAttribute(self.fn[k].ptr, MAX_DYNAMIC_SMEM, nbytes)
