"""Thin launchers for the CUDA kernels in this folder (one .cu file per family), compiled at first
use by CuPy (NVRTC). CuPy is handed in by engine/ops/backend.py, the only module that imports it.
Every kernel has a NumPy reference (engine/ops/backend.py ArrayOps, gguf.quants.dequantize) that
tools/device/gpu_kernels_check.py compares it with on the GPU.

GpuKernels is composed of one part a job, each in its own module, the launchers beside their family's
.cu file: loader.py (which kernels are built and how they are loaded), device_steps.py (the Step on
the device), norm_rope_launch.py, argmax_launch.py, attention_launch.py, matvec_launch.py (quant.cu's
matvecs, mmq.cu, mmv.cu), dequant_launch.py (quant.cu's dequant_ and embed_), moe_launch.py (moe.cu);
limits.py and args.py hold what several of them share. The names the house imports from here (the
launch geometry, DEQUANT, WEIGHT_KINDS, KERNEL_DIR...) are re-exported below; importing this package
needs no CuPy."""
from __future__ import annotations

import os
import sys
from types import ModuleType

from engine.kernels import build, launch, moe_launch, sm90
from engine.kernels.argmax_launch import ArgmaxLauncher
from engine.kernels.args import NULL, log2, pool_args
from engine.kernels.attention_launch import (
    ATTENTION_ROWS, DECODE_BLOCKS_PER_SM, DECODE_MAX_SPLITS, DECODE_SPLITS, DECODE_THREADS, HEAD_DIMS,
    MAX_COUNTER_HEADS, MAX_GROUP, PROMPT_ATTENTION, AttentionLaunchers, attention_smem_bytes, decode_blocks_x,
    decode_keys_per_block, decode_splits)
from engine.kernels.dequant_launch import DEQUANT, WEIGHT_KINDS, DequantLaunchers
from engine.kernels.device_steps import DeviceSteps
from engine.kernels.fused_launch import FusedLaunchers
from engine.kernels.limits import COUNTER_SEQUENCES, MATVEC_ROWS, MATVEC_THREADS, Q8_BYTES, THREADS, blocks
from engine.kernels.linear_attention_launch import LinearAttentionLaunchers
from engine.kernels.loader import KernelLoader, built_kernels, find_function, is_dependent
from engine.kernels.model_parts import ModelKernels
from engine.kernels.matvec_launch import (
    MATVEC_PAIRS, MATVEC_SOLO_ROWS, MATVEC_STAGE_MATRIX, MATVEC_STAGE_MAX, MAX_BATCH_ROWS, MMQ_FROM, MMQ_MT, MMQ_SMEM,
    MMQ_STAGES, MMQ_THREADS, MMQ_TILES, MMV_THREADS, MMV_TILE_ROWS, MatvecLaunchers, matvec_rows, matvec_stage,
    mmq_grid, mmq_smem_bytes, mmq_stages, sbq_wanted, tiles)
from engine.kernels.norm_rope_launch import NORM_MAX_WIDTH, NormRopeLaunchers
from engine.kernels.sources import KERNEL_DIR, OPTIONS, kernel_source

__all__ = [  # what the house imports from here (tools' and tests' too), wherever it is defined
    "GpuKernels", "ModelKernels", "build", "launch", "moe_launch", "sm90",
    # sources.py, loader.py
    "KERNEL_DIR", "OPTIONS", "kernel_source", "built_kernels", "find_function", "is_dependent",
    # limits.py, args.py
    "THREADS", "Q8_BYTES", "COUNTER_SEQUENCES", "MATVEC_ROWS", "MATVEC_THREADS", "blocks", "NULL", "log2", "pool_args",
    # dequant_launch.py, norm_rope_launch.py
    "WEIGHT_KINDS", "DEQUANT", "NORM_MAX_WIDTH",
    # attention_launch.py
    "ATTENTION_ROWS", "PROMPT_ATTENTION", "DECODE_THREADS", "DECODE_SPLITS", "DECODE_MAX_SPLITS",
    "DECODE_BLOCKS_PER_SM", "MAX_GROUP", "HEAD_DIMS", "MAX_COUNTER_HEADS", "attention_smem_bytes",
    "decode_keys_per_block", "decode_splits", "decode_blocks_x",
    # matvec_launch.py
    "MATVEC_SOLO_ROWS", "MATVEC_STAGE_MAX", "MATVEC_STAGE_MATRIX", "MATVEC_PAIRS", "MAX_BATCH_ROWS", "MMQ_FROM",
    "MMQ_THREADS", "MMQ_MT", "MMQ_STAGES", "MMQ_SMEM", "MMQ_TILES", "MMV_THREADS", "MMV_TILE_ROWS", "matvec_rows",
    "matvec_stage", "mmq_stages", "mmq_smem_bytes", "mmq_grid", "tiles"]


class GpuKernels(KernelLoader, DeviceSteps, NormRopeLaunchers, ArgmaxLauncher, AttentionLaunchers, MatvecLaunchers,
                 FusedLaunchers, DequantLaunchers, LinearAttentionLaunchers):
    """Every kernel of this folder, loaded once (KernelLoader), with its family's launchers; what they
    share is set here: cp, fn, the paths a launch may take (prompt_attention, dependent, stage, pairs,
    mmq_from), the device's multiprocessors (sms), flash-decoding's counters and the scratch."""

    def __init__(self, cp: ModuleType, defines: tuple[str, ...] = (), prompt_attention: str | None = None,
                 model: ModelKernels | None = None):
        """defines: NAME=VALUE macros for every kernel file (a tool's way to time a kernel's variants).
        prompt_attention: "sm90" or "mma" (PROMPT_ATTENTION; default $STRATA_PROMPT_ATTENTION, else sm90
        where the device has it). model: the kernels built first are those it needs (model_parts.py),
        the others at their first use; every kernel without it."""
        self.cp = cp
        wanted = prompt_attention or os.environ.get("STRATA_PROMPT_ATTENTION")
        self.load_modules(defines, model, wanted)  # fn: kernel name -> RawKernel, looked up once (not per
        # launch), filled by ready(): the kernels are built while the caller loads the weights
        # programmatic dependent launch (launch.py) while `dependent` is set: a decode graph's capture
        # sets it to `pdl` (compute capability 9.0 and later, unless $STRATA_PDL is 0)
        hopper = int(cp.cuda.Device().compute_capability) >= 90
        self.driver = launch.Driver() if hopper else None
        self.pdl = hopper and os.environ.get("STRATA_PDL", "1") != "0"
        self.dependent = False
        # quantized matvecs stage their weight rows in shared memory by bulk copies (stage.cuh; compute
        # capability 9.0, unless $STRATA_MATVEC_STAGE is 0)
        self.stage = hopper and os.environ.get("STRATA_MATVEC_STAGE", "1") != "0"
        self.pairs = True  # two stacked quantized parts against one row of x in one launch (matvec2_*)
        self.fused_matvec = os.environ.get("STRATA_FUSED_MATVEC", "0") == "1"  # engine/kernels/fused_launch.py
        # the int8 tensor-core batches (mmq.cu) take up to 227 KiB of shared memory a block: Hopper's
        self.mmq_from = int(os.environ.get("STRATA_MMQ_FROM", MMQ_FROM)) if hopper else sys.maxsize
        self.sbq = sbq_wanted()  # issue 48's super-block order for Q4_K / Q6_K matrices (sbq.cu), opt-in
        self.sms = cp.cuda.Device().attributes["MultiProcessorCount"]
        # flash-decoding's per-(sequence, K/V head group) block counters, int32, zero at rest; made here
        # with the default allocator, never in a graphs' pool: every captured graph keeps their address
        self.counters = cp.zeros(COUNTER_SEQUENCES * MAX_COUNTER_HEADS, dtype=cp.int32)
        self.norm_counter = cp.zeros(1, dtype=cp.int32)  # matvec_norm's blocks finished, likewise
        self.scratch = None  # fp16 values of the largest quantized matrix: a prompt chunk's GEMM operand
        self.kept = {}  # quantized matrices expanded once and kept (DequantLaunchers.keep)
        self.moe = moe_launch.MoeKernels(self)
