"""The Hopper prompt-attention kernel's host side (engine/kernels/sm90.py) against its source: the
launch geometry and shared memory the launcher uses are the kernel's own, the source needs no CUDA
header (NVRTC builds it with no include path), and the shared memory fits a Hopper block. The kernel
itself runs on the device only: tools/device/gpu_kernels_check.py compares it with NumPy there."""
import re

from engine.kernels import KERNEL_DIR, kernel_source, sm90


def constants(source: str) -> dict[str, int]:
    """The file's top-level `constexpr int NAME = expression;` lines, evaluated in order (expressions of
    integers and earlier names)."""
    values: dict[str, int] = {}
    for name, expr in re.findall(r"^constexpr int (\w+) = ([^;]+);", source, re.MULTILINE):
        values[name] = int(eval(expr, {"__builtins__": {}}, dict(values)))
    return values


def test_launch_geometry_is_the_kernels():
    c = constants((KERNEL_DIR / "attention_sm90.cu").read_text())
    assert (c["THREADS"], c["BR"], c["BC"], c["STAGES"]) == (sm90.THREADS, sm90.ROWS, sm90.TILE_KEYS, sm90.STAGES)


def test_shared_memory_fits_a_hopper_block():
    # the Q tile and STAGES (K, V) tiles of fp16, 1 KiB to align them: at most 227 KiB a block
    for d in (64, 128):
        assert sm90.smem_bytes(d) == (sm90.ROWS + 2 * sm90.STAGES * sm90.TILE_KEYS) * d * 2 + 1024
    assert sm90.smem_bytes(128) <= 227 * 1024


def test_source_needs_no_cuda_header():
    source = kernel_source("attention_sm90.cu")
    assert "#include" not in source and "#pragma once" not in source
    for name in ("online_softmax", "wgmma_ss_n128", "wgmma_rs_n128_t", "kv_row", "cp_async16_to"):
        assert len(re.findall(rf"__device__ __forceinline__ [\w ]+ {name}\(", source)) == 1, name  # pasted once
