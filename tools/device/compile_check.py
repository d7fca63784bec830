"""Compile the engine's CUDA kernels for a GPU architecture on a machine without one: NVRTC (as CuPy
runs it at the engine's first use, same sources and options) to PTX, then ptxas for the registers,
spills and shared memory of each kernel. It catches a kernel that does not build before a device
call is spent on it.

    pip install nvidia-cuda-nvrtc-cu12 nvidia-cuda-runtime-cu12 nvidia-cuda-nvcc-cu12   # once, in any venv
    python tools/device/compile_check.py [FILE.cu ...] [--arch sm_90] [-D NAME=VALUE ...] [--kernels REGEX]

Exit status 0 when every file compiles.
"""
from __future__ import annotations

import argparse
import ctypes
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def nvidia_dir(name: str) -> Path:
    import nvidia  # the namespace package the CUDA wheels install into

    for base in nvidia.__path__:
        if (Path(base) / name).is_dir():
            return Path(base) / name
    raise SystemExit(f"nvidia/{name} not found: pip install the CUDA wheels named in this file's docstring")


def nvrtc_ptx(source: str, name: str, options: list[str]) -> str:
    lib = ctypes.CDLL(str(next((nvidia_dir("cuda_nvrtc") / "lib").glob("libnvrtc.so.*"))))
    prog = ctypes.c_void_p()
    check = lambda rc, what: rc == 0 or sys.exit(f"{what}: nvrtc error {rc}")  # noqa: E731
    check(lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), name.encode(), 0, None, None), "create")
    opts = [o.encode() for o in options]
    rc = lib.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
    size = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetProgramLog(prog, log)
    if rc != 0:
        print(log.value.decode(errors="replace"))
        raise SystemExit(f"{name}: does not compile")
    lib.nvrtcGetPTXSize(prog, ctypes.byref(size))
    ptx = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetPTX(prog, ptx)
    return ptx.value.decode()


def main() -> int:
    from engine.kernels import KERNEL_DIR, OPTIONS, kernel_source

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("files", nargs="*", help="kernel files (default: every .cu of engine/kernels)")
    p.add_argument("--arch", default="sm_90")
    p.add_argument("-D", dest="defines", action="append", default=[])
    p.add_argument("--kernels", default=".", help="report only kernels whose name matches")
    p.add_argument("--keep", help="a folder to keep each file's cubin in (FILE.cubin), for nvdisasm / cuobjdump "
                   "(tools/device/sass_counts.py reads them)")
    a = p.parse_args()
    files = a.files or sorted(f.name for f in KERNEL_DIR.glob("*.cu"))
    include = str(nvidia_dir("cuda_runtime") / "include")
    ptxas = nvidia_dir("cuda_nvcc") / "bin" / "ptxas"
    for name in files:
        name = Path(name).name
        options = [*OPTIONS, f"-arch=compute_{a.arch[3:]}", f"-I{include}", *(f"-D{d}" for d in a.defines)]
        ptx = nvrtc_ptx(kernel_source(name), name, options)
        with tempfile.TemporaryDirectory() as tmp:
            (Path(tmp) / "k.ptx").write_text(ptx)
            run = subprocess.run([str(ptxas), f"-arch={a.arch}", "-v", "-o", f"{tmp}/k.cubin", f"{tmp}/k.ptx"],
                                 capture_output=True, text=True)
            if a.keep and not run.returncode:
                Path(a.keep).mkdir(parents=True, exist_ok=True)
                shutil.copy(f"{tmp}/k.cubin", Path(a.keep) / f"{Path(name).stem}.cubin")
        if run.returncode:
            print(run.stderr)
            return 1
        current = None
        for line in run.stderr.splitlines():  # "Compiling entry function 'x'", then its "Used N registers ..."
            m = re.search(r"entry function '(\w+)'", line)
            current = m.group(1) if m else current
            if current and re.search(a.kernels, current) and ("Used" in line or "spill" in line and " 0 bytes spill" not in line):
                print(f"{name} {current}: {line.split(':', 1)[-1].strip()}")
        print(f"{name}: compiles for {a.arch}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
