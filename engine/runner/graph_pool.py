"""The device memory CUDA graphs' temporaries come from, which is never given back while graphs exist.

A captured graph keeps the addresses of every buffer its kernels touched. Graphs that replay one
after another on one stream may share their temporaries (a graph's are free again once its capture
ends, and the next capture reuses them), but that memory must stay allocated for as long as any
graph may replay. CuPy's MemoryPool, when cudaMalloc reports the device full, frees every block it
holds that no array references (`free_all_blocks`) and tries again: exactly the blocks the captured
graphs still use. Their next replay then reads and writes freed memory (cudaErrorIllegalAddress:
what crashed the engine when 64 requests made it capture graph after graph near a full device).
The pool here asks the device through an allocator that reports "full" as GraphMemoryError, an
error CuPy does not answer by freeing: a capture that does not fit fails alone, cleanly, and the
graphs captured before it keep their memory.
"""
from __future__ import annotations


class GraphMemoryError(RuntimeError):
    """The device has no room for a graph's temporaries (nothing was freed to make room)."""


def graph_memory_pool(cp):
    """A cupy MemoryPool for graphs' temporaries whose blocks are never released (see above)."""
    runtime = cp.cuda.runtime
    full = getattr(runtime, "errorMemoryAllocation", 2)  # cudaErrorMemoryAllocation

    def device_malloc(size: int):
        try:
            return cp.cuda.memory._malloc(size)
        except runtime.CUDARuntimeError as e:
            if e.status != full:
                raise
            raise GraphMemoryError(f"no device memory for {size:,} bytes of CUDA graph temporaries") from None

    return cp.cuda.MemoryPool(device_malloc)
