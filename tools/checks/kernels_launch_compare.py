"""The GpuKernels of before its split (issue 43) and the one of now, each driven through the same calls
on the CPU with a stand-in for CuPy: NumPy arrays with addresses, kernels that record their launches.
Every launch (its kernel, grid, block, shared memory, cap on dynamic shared memory, and arguments:
an array as its allocation, offset, shape, dtype and strides, a scalar as its dtype and value), every
dependent launch, every result's shape and dtype, every error and the state left on the object must
be equal, in the same order. What the kernels compute is not run here: that is the GPU's check
(tools/device/gpu_kernels_check.py); this says the split launches them as before.

    python tools/checks/kernels_launch_compare.py [--old REV]
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import types
from pathlib import Path
from types import SimpleNamespace

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import engine.kernels as new_kernels  # noqa: E402
from engine.core.kv_types import Q8Array  # noqa: E402
from engine.core.quantized import BLOCKS, QuantMatrix, QuantPart, Row8, row_bytes  # noqa: E402
from engine.kernels import build, launch, moe_launch, sm90  # noqa: E402
from engine.core.experts import Experts, ExpertStack  # noqa: E402

OLD_REV = "9eac495"  # the last commit with GpuKernels whole in engine/kernels/__init__.py
LOADER_STATE = ("hopper", "defines", "loaded", "building", "pending")  # the loader's own bookkeeping since issue
# 42 (kernels built per model in a thread beside the weights' upload, the rest at first use: engine/kernels/loader.py),
# not the launchers' state; prompt_attention is a property over _prompt_attention (known once the build is loaded)
LOG: list = []  # launches, in order
ALLOCS: list = []  # (start, end, label) of every device array of a run
HANDLES: dict = {}  # a recorded kernel's handle -> its name


class DeviceArray(np.ndarray):
    """A NumPy array that answers as CuPy's does where the launchers ask: .data.ptr, .set(host)."""

    @property
    def data(self):
        return SimpleNamespace(ptr=self.__array_interface__["data"][0])

    def set(self, host):
        np.copyto(self, np.asarray(host).reshape(self.shape))


def device(a, label: str | None = None) -> DeviceArray:
    a = np.array(a, copy=True, order="C").view(DeviceArray)
    start = a.__array_interface__["data"][0]
    temps = sum(1 for *_, name in ALLOCS if name.startswith("t#"))
    ALLOCS.append((start, start + max(1, a.nbytes), label or f"t#{temps}"))
    return a


def describe(a):
    if isinstance(a, np.ndarray):
        p = a.__array_interface__["data"][0]
        label, start = next(((name, s) for s, e, name in reversed(ALLOCS) if s <= p < e), ("?", p))
        return ("array", label, p - start, a.shape, str(a.dtype), a.strides)
    if isinstance(a, np.generic):
        return (str(a.dtype), a.item())
    return ("python", type(a).__name__, a)


class Function:
    """A kernel: records each launch."""

    def __init__(self, name: str):
        self.name, self.kernel, self.max_dynamic_shared_size_bytes = name, SimpleNamespace(ptr=id(self)), 0
        HANDLES[id(self)] = name

    def __call__(self, grid, block, args, shared_mem=0):
        LOG.append(("cupy", self.name, grid, block, tuple(map(describe, args)), shared_mem,
                    self.max_dynamic_shared_size_bytes))


class Module:
    def __init__(self, code, options):
        pass

    def get_function(self, name: str) -> Function:
        return Function(name)


class Driver:
    def launch(self, function, grid, block, args, shared_mem, stream):
        LOG.append(("dependent", HANDLES[function], grid, block, tuple(map(describe, args)), shared_mem))


class Sm90:
    def __init__(self, cp, source, name, kernels, options, smem):
        self.fn = {k: Function(k) for k in kernels}
        for k, nbytes in smem.items():
            self.fn[k].max_dynamic_shared_size_bytes = nbytes


def fake_cupy() -> types.ModuleType:
    """CuPy as the launchers use it, on NumPy; an H200 (compute capability 9.0, 132 multiprocessors)."""
    cp = types.ModuleType("cupy_on_numpy")
    for name in ("float16", "float32", "int32", "int64", "uint8", "int8", "uint64"):
        setattr(cp, name, getattr(np, name))
    for name in ("empty", "zeros", "arange"):
        setattr(cp, name, lambda *a, _f=getattr(np, name), **k: device(_f(*a, **k)))
    cp.ascontiguousarray = lambda a: a if a.flags.c_contiguous else device(a)
    cp.asarray = lambda a, dtype=None: (a if isinstance(a, DeviceArray) and dtype in (None, a.dtype)
                                        else device(np.asarray(a, dtype=dtype)))
    cp.cuda = SimpleNamespace(Device=lambda: SimpleNamespace(compute_capability="90",
                                                             attributes={"MultiProcessorCount": 132}),
                              get_current_stream=lambda: SimpleNamespace(ptr=7))
    cp.RawModule = Module
    build.prebuild = lambda *a, **k: None
    launch.Driver = Driver
    sm90.Sm90Kernels = Sm90
    return cp


def old_kernels(rev: str) -> type:
    """The GpuKernels of `rev`'s engine/kernels/__init__.py (its `moe` module is moe_launch now)."""
    text = subprocess.run(["git", "show", f"{rev}:engine/kernels/__init__.py"], cwd=ROOT, check=True,
                          capture_output=True, text=True).stdout
    sys.modules["engine.kernels.moe"] = new_kernels.moe = moe_launch
    module = types.ModuleType("old_kernels")
    exec(compile(text, f"{rev}:engine/kernels/__init__.py", "exec"), module.__dict__)
    del new_kernels.moe, sys.modules["engine.kernels.moe"]
    return module.GpuKernels


def inputs() -> dict:
    rng = np.random.default_rng(0)
    d = {}

    def half(name, *shape):
        d[name] = device(rng.standard_normal(shape).astype(np.float16), name)

    d["x"] = device(rng.standard_normal((5, 4096)).astype(np.float32), "x")
    d["x1"] = device(rng.standard_normal((1, 4096)).astype(np.float32), "x1")
    d["w"] = device(np.ones(4096, np.float32), "w")
    d["cos"] = device(np.ones((4096, 1, 64), np.float32), "cos")
    d["logits"] = device(rng.standard_normal((3, 1000)).astype(np.float32), "logits")
    for name, shape in (("delta", (5, 4096)), ("qkv", (5, 48 * 128)), ("kc", (64, 8, 64, 128)),
                        ("vc", (64, 8, 64, 128)), ("kc64", (16, 4, 64, 64)), ("vc64", (16, 4, 64, 64)),
                        ("gate_up", (5, 2048)), ("q", (5, 32, 128)), ("qdec", (4, 32, 128)), ("q64", (2, 36, 64)),
                        ("f16w", (80, 1024)), ("xs", (70, 1024)), ("h", (3, 1024))):
        half(name, *shape)
    d["kq"], d["vq"] = (Q8Array(device(np.zeros((64, 8, 64, 128), np.int8), f"{n}q"),
                                device(np.zeros((64, 8, 64, 4), np.float16), f"{n}s")) for n in "kv")
    for kind in BLOCKS:
        d[kind] = QuantPart(kind, device(rng.integers(0, 255, (96, row_bytes(kind, 1024)), dtype=np.uint8), kind), 96)
    d["raw"] = {kind: np.zeros((96, row_bytes(kind, 1024)), np.uint8) for kind in BLOCKS}
    d["bf16"] = np.zeros((64, 512), np.uint8)

    def stack(kind, rows, cols, name):
        if kind == "F16":
            return ExpertStack(kind, device(np.zeros((8 * rows, cols), np.float16), name), 8, rows, cols)
        return ExpertStack(kind, device(np.zeros((8 * rows, row_bytes(kind, cols)), np.uint8), name), 8, rows, cols)

    d["experts"] = [  # gate and up of one kind (one launch for both), then of two kinds with an fp16 down
        Experts(stack("Q4_K", 256, 1024, "g"), stack("Q4_K", 256, 1024, "u"), stack("Q6_K", 1024, 256, "d")),
        Experts(stack("Q4_K", 256, 1024, "g2"), stack("Q5_0", 256, 1024, "u2"), stack("F16", 1024, 256, "d2"))]
    d["router"] = device(np.zeros((8, 1024), np.float32), "router")
    return d


def drive(k, d) -> list:
    """Every launcher through its paths; -> each result's (name, shape, dtype), and errors."""
    out = []

    def r(name, v):
        out.append((name, getattr(v, "shape", None), str(getattr(v, "dtype", type(v).__name__))))

    prompt, lone = k.step(5, 70, [3, 1, 2, 0]), k.step(1, 70, [3, 1, 2, 0])
    batch = k.batch_step([np.array([1, 2]), np.array([3])], (70, 30))
    graph = k.batch_step([np.array([1, 2]), np.array([3]), np.array([4, 5, 6]), np.array([7])], (70, 30, 150, 5),
                         max_keys=256, block=64)
    for q8 in (False, True):
        r("add_rms_norm", k.add_rms_norm(d["x"], d["delta"], d["w"], 1e-6, q8=q8))
        r("add_rms_norm 1", k.add_rms_norm(d["x1"], None, d["w"], 1e-5, q8=q8))
        r("silu_mul", k.silu_mul(d["gate_up"], q8=q8))
    for kc, vc in ((d["kc"], d["vc"]), (d["kq"], d["vq"])):
        r("rope_store", k.rope_store(d["qkv"], d["cos"], d["cos"], kc, vc, prompt))
        r("rope_store normed", k.rope_store(d["qkv"], d["cos"], d["cos"], kc, vc, prompt, (d["w"], d["w"], 1e-6)))
        r("rope_store batch", k.rope_store(d["qkv"][:2], d["cos"], d["cos"], kc, vc, batch))
        for kind in ("sm90", "mma"):
            k.prompt_attention, prompt.held = kind, None
            r(f"attention {kind}", k.attention(d["q"], kc, vc, prompt))
        for q8 in (False, True):
            r("decode", k.attention(d["qdec"][:2], kc, vc, batch, q8=q8))
            r("decode graph", k.attention(d["qdec"], kc, vc, graph, q8=q8))
            r("decode lone", k.attention(d["qdec"][:1], kc, vc, lone, q8=q8))
    for group in range(1, 9):
        r(f"decode group {group}", k.attention(d["q64"][:, : 4 * group], d["kc64"], d["vc64"], batch))
    r("argmax", k.argmax(d["logits"]))
    r("argmax row", k.argmax(d["logits"][0]))
    mixed = QuantMatrix((d["Q4_K"], d["Q6_K"], QuantPart("F16", d["f16w"], 80)), 1024)
    for dtype in (np.float32, np.float16):
        for n in (1, 3, 8, 20, 70):
            for kind in BLOCKS:
                r(f"matvec {kind} {n}", k.matvec(QuantMatrix((d[kind],), 1024), d["xs"][:n], dtype))
            r(f"matvec F16 {n}", k.matvec(d["f16w"], d["xs"][:n], dtype))
            r(f"matvec mixed {n}", k.matvec(mixed, d["xs"][:n], dtype))
        r("matvec a row", k.matvec(QuantMatrix((d["Q8_0"],), 1024), d["xs"][0], dtype))
    for kind, _ in new_kernels.MATVEC_PAIRS:
        for switch in ("pairs", "stage"):
            for on in (True, False):
                setattr(k, switch, on)
                r(f"matvec pair {kind}", k.matvec(QuantMatrix((d[kind], d["Q6_K"]), 1024), d["xs"][:1], np.float16))
    k.pairs = k.stage = True
    xq = k.quantize_q8(d["xs"][0])
    r("quantize_q8", xq)
    r("matvec q8", k.matvec(QuantMatrix((d["Q4_K"],), 1024), d["xs"][0], np.float16, xq))
    r("embed", k.embed(QuantMatrix((d["Q6_K"],), 1024), [1, 5, 9]))
    k.reserve_scratch(300 * 1024)
    k.reserve_scratch(100 * 1024)
    r("expand", k.expand(mixed))
    for kind in BLOCKS:
        r(f"dequantize {kind}", k.dequantize(d["raw"][kind], kind, (96, 1024)))
    r("dequantize BF16", k.dequantize(d["bf16"], "BF16", (64, 256)))
    for experts in d["experts"]:
        chosen, weights = k.moe.route(d["h"], d["router"], 2, True)
        r("moe prompt", k.moe.prompt(d["h"], experts, chosen, weights))
        chosen, weights = k.moe.route(d["h"][:1], d["router"], 2, True, decode=True)
        r("moe decode", k.moe.decode(Row8(d["h"][:1], k.quantize_q8(d["h"][0])), experts, chosen, weights))
    k.dependent = True  # a decode graph's capture
    r("dependent norm", k.add_rms_norm(d["x1"], None, d["w"], 1e-6, q8=True))
    r("dependent matvec", k.matvec(QuantMatrix((d["Q4_K"], d["Q6_K"]), 1024), d["xs"][:1], np.float16))
    r("dependent decode", k.attention(d["qdec"][:2], d["kc"], d["vc"], batch, q8=True))
    r("dependent argmax", k.argmax(d["logits"]))
    k.dependent = False
    for bad in (lambda: k.attention(d["q64"][:, :18], d["kc64"][:, :2], d["vc64"][:, :2], batch),
                lambda: k.attention(d["q64"][:, :4, :48], d["kc64"], d["vc64"], batch),
                lambda: k.add_rms_norm(d["x"][:, :100], None, d["w"], 1e-6)):
        try:
            bad()
            out.append(("no error",))
        except ValueError as e:
            out.append(("error", str(e)))
    return out


def run(cls, cp) -> dict:
    LOG.clear()
    ALLOCS.clear()
    d = inputs()
    k = cls(cp)
    made = list(LOG)
    LOG.clear()
    results = drive(k, d)
    return {"launches at start": made, "launches": list(LOG), "results": results,
            "functions": [(n, type(f).__name__, f.max_dynamic_shared_size_bytes) for n, f in k.fn.items()],
            "state": sorted((n.lstrip("_"), v) for n, v in vars(k).items()
                            if isinstance(v, (bool, int, str, type(None))) and n not in LOADER_STATE),
            "attributes": sorted({n.lstrip("_") for n in vars(k)} - set(LOADER_STATE))}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--old", default=OLD_REV, help="the commit whose engine/kernels/__init__.py is the reference")
    a = p.parse_args()
    cp = fake_cupy()
    before, now = run(old_kernels(a.old), cp), run(new_kernels.GpuKernels, cp)
    same = True
    for name in before:
        x, y = before[name], now[name]
        same &= x == y
        print(f"{name}: {len(x)} before, {len(y)} now, {'equal' if x == y else 'DIFFERENT'}")
        for i, (p_, q) in enumerate(zip(x, y)):
            if p_ != q:
                print(f"  first difference at {i}:\n  before {p_}\n  now    {q}")
                break
    kernels = {entry[1] for entry in before["launches"]}
    dependent = sum(1 for entry in before["launches"] if entry[0] == "dependent")
    print(f"{len(kernels)} distinct kernels launched, {dependent} dependent launches")
    print("ok" if same else "the split changed a launch")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
