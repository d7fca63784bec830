"""Memory figures the engine and the server share (no third-party import: the server reads them too): what the
host's memory holds and has left, as the kernel reports it, and what an engine keeps on a GPU beside its weights."""
from __future__ import annotations

import os

MiB = 1 << 20
RESERVE_BYTES = 1024 * MiB  # on a GPU beside the weights and the KV pool: cuBLAS workspace, kernels, allocator slack
KV_FLOOR_BYTES = 1 << 30  # the least a KV pool, the prompt scratch and the allocator's slack are left


def out_of_memory(e: BaseException) -> bool:
    """Whether e says the host's or a device's memory ran out: a MemoryError, or CuPy's OutOfMemoryError (which is
    not one, and is named here rather than imported: the CPU engine has no CuPy)."""
    return isinstance(e, MemoryError) or "OutOfMemory" in type(e).__name__


def available_memory() -> int:
    """Bytes of host memory the kernel says a new process may take (MemAvailable: free pages and those it can
    reclaim, a model file's cached pages among them); very large if unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 2**62


def host_memory_bytes() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 16 << 30


def device_memory_report(cp, pools: dict[str, object]) -> str:
    """Where a GPU's memory is (an out-of-memory's log line): the device's free and total, CuPy's default pool (the
    weights, the KV pool, a step's temporaries) in use and held, and each of `pools` (MemoryPools by what they
    hold) held."""
    gib = lambda n: f"{n / 2**30:.2f}"  # noqa: E731
    free, total = cp.cuda.runtime.memGetInfo()
    arrays = cp.get_default_memory_pool()
    held = [f"{name} {gib(pool.total_bytes())} GiB held" for name, pool in pools.items() if pool is not None]
    return "; ".join([f"device {gib(free)} of {gib(total)} GiB free",
                      f"arrays {gib(arrays.used_bytes())} GiB in use of {gib(arrays.total_bytes())} held", *held])
