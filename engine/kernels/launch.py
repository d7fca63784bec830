"""Kernel launches with programmatic dependent launch (PDL, compute capability 9.0).

A decode step is a chain of a few hundred small kernels, each of which may start only when the one
before it has finished: between two of them the GPU idles for the launch (a microsecond or two),
and a matvec starts its weight read only once the norm or attention before it is done. Launched
with CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION, a kernel's blocks may start while its
predecessor still runs; they prefetch their weights into L2 and then wait in after_producer()
(pdl.cuh) for the predecessor's results. CuPy's launches take no launch attributes, so these go
through the driver's cuLaunchKernelEx by ctypes. Only the decode graphs' captures use them (the
attribute is recorded as a programmatic edge of the graph): a replay pays nothing in Python, and
prompt chunks keep CuPy's launches.
"""
from __future__ import annotations

import ctypes

import numpy as np

PROGRAMMATIC_STREAM_SERIALIZATION = 6  # CUlaunchAttributeID
SCALARS = {np.dtype(np.int32): ctypes.c_int32, np.dtype(np.int64): ctypes.c_int64,
           np.dtype(np.uint32): ctypes.c_uint32, np.dtype(np.uint64): ctypes.c_uint64,
           np.dtype(np.float32): ctypes.c_float, np.dtype(np.float64): ctypes.c_double}


class LaunchAttribute(ctypes.Structure):  # CUlaunchAttribute: an id, then a 64-byte value union at offset 8
    _fields_ = [("id", ctypes.c_uint32), ("pad", ctypes.c_char * 4), ("value", ctypes.c_int32),
                ("rest", ctypes.c_char * 60)]


class LaunchConfig(ctypes.Structure):  # CUlaunchConfig
    _fields_ = [("grid", ctypes.c_uint32 * 3), ("block", ctypes.c_uint32 * 3), ("shared_mem", ctypes.c_uint32),
                ("stream", ctypes.c_void_p), ("attrs", ctypes.POINTER(LaunchAttribute)), ("num_attrs", ctypes.c_uint32)]


def dims(d) -> tuple[int, int, int]:
    d = tuple(int(v) for v in (d if isinstance(d, tuple) else (d,)))
    return (*d, *(1,) * (3 - len(d)))


def argument(a):
    """One kernel argument as the ctypes value CuPy would pass: a device array's address, a NumPy
    scalar as its own type. Anything else is refused (its C type would be a guess)."""
    if hasattr(a, "data") and hasattr(a.data, "ptr"):
        return ctypes.c_void_p(a.data.ptr)
    if isinstance(a, np.generic) and a.dtype in SCALARS:
        return SCALARS[a.dtype](a.item())
    raise TypeError(f"a dependent launch takes device arrays and NumPy scalars, not {type(a).__name__}")


class Driver:
    """libcuda's cuLaunchKernelEx."""

    def __init__(self):
        self.lib = ctypes.CDLL("libcuda.so.1")
        self.lib.cuLaunchKernelEx.argtypes = [ctypes.POINTER(LaunchConfig), ctypes.c_void_p,
                                              ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p]
        self.attr = LaunchAttribute(id=PROGRAMMATIC_STREAM_SERIALIZATION, value=1)

    def launch(self, function: int, grid, block, args, shared_mem: int, stream: int) -> None:
        values = [argument(a) for a in args]
        params = (ctypes.c_void_p * max(1, len(values)))(*(ctypes.cast(ctypes.pointer(v), ctypes.c_void_p)
                                                          for v in values))
        config = LaunchConfig(dims(grid), dims(block), shared_mem, stream, ctypes.pointer(self.attr), 1)
        err = self.lib.cuLaunchKernelEx(ctypes.byref(config), function, params, None)
        if err:
            name = ctypes.c_char_p()
            self.lib.cuGetErrorName(err, ctypes.byref(name))
            raise RuntimeError(f"cuLaunchKernelEx: {name.value.decode() if name.value else err}")


class Kernel:
    """A kernel called as CuPy's RawKernel is, fn(grid, block, args, shared_mem=0): a dependent
    launch while its owner's `dependent` is set (the kernel calls after_producer()), else CuPy's."""

    def __init__(self, fn, owner, handle: int):
        self.fn, self.owner, self.handle = fn, owner, handle

    def __call__(self, grid, block, args, shared_mem: int = 0) -> None:
        if self.owner.dependent:
            self.owner.driver.launch(self.handle, grid, block, args, shared_mem,
                                     self.owner.cp.cuda.get_current_stream().ptr)
        else:
            self.fn(grid, block, args, shared_mem=shared_mem)

    def __getattr__(self, name):  # attributes (registers, shared memory) are the kernel's
        return getattr(self.fn, name)
