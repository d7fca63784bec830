"""The engine's GPU backend on the CPU: HalfCupyOps and GpuKernels as the engine builds them, over NumPy in CuPy's
place (HostCupy: the few CuPy names the code uses beyond NumPy's) and engine/kernels' CUDA sources run on the
host (host_cuda.py), the parts a model needs (engine/kernels/model_parts.py) compiled for it. A forward pass
then goes through every kernel launch and launcher a GPU's would, without CUDA graphs, streams or the
sm_90-only kernels (the prompt attention is mma.sync's); its numbers follow the host's float rules."""
from __future__ import annotations

from contextlib import nullcontext
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from engine.kernels import GpuKernels, build, moe_launch
from engine.kernels.limits import COUNTER_SEQUENCES
from engine.kernels.attention_launch import MAX_COUNTER_HEADS
from engine.kernels.loader import built_kernels
from engine.kernels.matvec_launch import MMQ_FROM
from engine.kernels.model_parts import ModelKernels
from engine.model.weights import load_model
from engine.modelfile.gguf_file import GGUFFile
from engine.modelfile.model_config import read_config
from engine.ops.backend import Backend, HalfCupyOps
from tests.engine.kernels.host_cuda import Launch, host_library
from tests.engine.kernels.test_model_parts import defined  # the kernels one compilation holds


class HostArray(np.ndarray):
    """A NumPy array with CuPy's host copies: set (from the host) and get (to the host)."""

    def set(self, values) -> None:
        self[...] = values

    def get(self) -> np.ndarray:
        return np.array(self)


def host(a):
    return a.view(HostArray) if isinstance(a, np.ndarray) and not isinstance(a, HostArray) else a


class HostMemoryPool:
    """CuPy's MemoryPool by name (engine/kvcache/state_memory.py makes one): the host's arrays come from NumPy,
    whatever allocator is in use, so it holds nothing."""

    def __init__(self, allocator=None):
        self.allocator = allocator

    def malloc(self, size: int):
        return bytearray(size)

    def used_bytes(self) -> int:
        return 0

    total_bytes = used_bytes


class HostCupy:
    """NumPy under CuPy's name: arrays it makes are HostArrays; cuda's synchronizations are nothing, its memory
    pools hold nothing."""

    cuda = SimpleNamespace(Stream=SimpleNamespace(null=SimpleNamespace(synchronize=lambda: None)),
                           alloc_pinned_memory=bytearray,  # (page-locked memory: plain host memory here)
                           MemoryPool=HostMemoryPool, using_allocator=lambda allocator=None: nullcontext())
    ndarray = HostArray

    def __getattr__(self, name: str):
        value = getattr(np, name)
        if not callable(value) or isinstance(value, type):
            return value
        return lambda *args, **kwargs: host(value(*args, **kwargs))

    @staticmethod
    def asnumpy(a) -> np.ndarray:
        return np.array(a)


def host_gpu_backend(model: ModelKernels, workdir: Path) -> Backend:
    """A "gpu" Backend for a model of these kernels' needs, its kernels compiled on the host into workdir."""
    cp = HostCupy()
    k = object.__new__(GpuKernels)
    k.cp, k.fn, k.pending, k._prompt_attention = cp, {}, None, "mma"
    launched = {n for names in built_kernels().values() for n in names}
    for unit in build.units(built_kernels()):
        if model.wants(unit) and unit.source != "attention_sm90.cu":
            names = tuple(sorted(defined(unit) & launched))
            folder = workdir / f"{Path(unit.source).stem}_{unit.part}"
            folder.mkdir(parents=True, exist_ok=True)
            lib = host_library(unit.source, folder, names, defines=tuple(o[2:] for o in unit.options(())
                                                                             if o.startswith("-D")))
            k.fn.update({n: Launch(getattr(lib, f"launch_{n}")) for n in names})
    k.driver, k.pdl, k.dependent, k.stage, k.pairs, k.mmq_from, k.sms = None, False, False, False, True, MMQ_FROM, 4
    k.counters = cp.zeros(COUNTER_SEQUENCES * MAX_COUNTER_HEADS, dtype=np.int32)
    k.norm_counter = cp.zeros(1, dtype=np.int32)
    k.scratch, k.kept = None, {}
    k.moe = moe_launch.MoeKernels(k)
    ops = object.__new__(HalfCupyOps)
    ops.xp, ops.kernels, ops.decoding = cp, k, False
    return Backend("gpu", cp, np.float16, "host-emulated GPU", ops)


def host_gpu_model(path: Path, workdir: Path) -> tuple[Backend, object, object]:
    """A model file loaded on host_gpu_backend, the kernels it needs compiled into workdir -> (backend, its
    ModelConfig, its Weights)."""
    reader = GGUFFile(str(path), "r")
    backend = host_gpu_backend(ModelKernels.of(read_config(reader), reader), workdir)
    cfg, weights, _ = load_model(str(path), backend, reader=reader)
    return backend, cfg, weights
