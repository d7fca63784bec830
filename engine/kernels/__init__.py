"""Thin launchers for the CUDA kernels in this folder (one .cu file per family), compiled at first
use by CuPy (NVRTC). CuPy is handed in by engine/ops/backend.py, the only module that imports it.
Every kernel has a NumPy reference (engine/ops/backend.py ArrayOps, gguf.quants.dequantize) that
tools/device/gpu_kernels_check.py compares it with on the GPU."""
from __future__ import annotations

import math
import os
import sys
from types import ModuleType

import numpy as np

from engine.core.step import Step
from engine.kernels import build, launch, moe, sm90
from engine.kernels.limits import COUNTER_SEQUENCES, MATVEC_ROWS, MATVEC_THREADS
from engine.kernels.sources import KERNEL_DIR, OPTIONS, kernel_source  # noqa: F401 - KERNEL_DIR: tools' too
from engine.core.kv_types import Q8Array
from engine.core.quantized import BLOCKS, UNIT, QuantMatrix, Row8, row_bytes

THREADS = 256
ATTENTION_ROWS = 64  # query rows (token x grouped head) per attention block: BR in attention.cu
PROMPT_ATTENTION = ("sm90", "mma")  # prompt-chunk attention kernels: wgmma (attention_sm90.cu, compute
# capability 9.0 only) and mma.sync (attention.cu, any GPU); $STRATA_PROMPT_ATTENTION picks one
DECODE_THREADS = 128  # a flash-decoding block: DEC_WARPS warps in attention.cu
DECODE_SPLITS = 48  # DEC_SPLITS in attention.cu: splits a long sequence is cut into (48 x 8 K/V heads fit
# one wave of 3 blocks on each of the H200's 132 multiprocessors; 64 took 1.29 waves, the last one a tail)
DECODE_MAX_SPLITS = -(-DECODE_SPLITS // 32) * 32  # DEC_MAX_SPLITS: the merge's capacity, whole warps of splits
DECODE_BLOCKS_PER_SM = 4  # flash-decoding blocks a multiprocessor before a block takes several splits
MAX_GROUP = 8  # query heads per K/V head the decoding kernels are built for (one kernel each)
HEAD_DIMS = (64, 128)  # head widths the attention kernel is built for

WEIGHT_KINDS = (*BLOCKS, "F16")  # each has dequant_ and embed_ kernels in quant.cu; the blocks matvec_ ones
# too, and fp16 weights the tensor-core mmv_f16_ kernels of mmv.cu
DEQUANT = (*BLOCKS, "BF16")  # the GGUF types the device expands to fp16 itself
MATVEC_SOLO_ROWS = 4  # a block's rows at one row of x: MV_WARPS warps of MV_SOLO_ROWS rows
MATVEC_STAGE_MAX = 64 * 1024  # shared memory a matvec block may stage its weight rows in (quant.cu, stage.cuh):
# more, and too few blocks fit an SM to keep its memory busy; such launches read the rows directly
MATVEC_STAGE_MATRIX = 4 << 20  # matrices of at most these bytes are staged: their launch is mostly waiting,
# and the bulk copies start before the kernel before them ends; larger ones were slower staged (a warp
# waits for its whole row, then computes with nothing of its own in flight: bench/HISTORY.md)
MAX_COUNTER_HEADS = 256  # K/V head groups per sequence the counters hold (kv_heads x kv_div)
MATVEC_PAIRS = tuple((kind, "Q6_K") for kind in ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K"))  # two
# stacked parts one launch takes against one row of x (matvec2_<A>_<B>: a QKV whose V rows are in Q6_K)
MAX_BATCH_ROWS = 16  # activation rows one quantized matvec launch takes (matvec_<T>_n1 .. _n16); more go in several
MMQ_FROM = 8  # rows of x from which a quantized matvec runs on the int8 tensor cores (mmq.cu: the same bits as
# matvec_<T>_n<NB>, one launch for any number of rows, each weight tile read once for up to 32 of them); below
# it the dp4a kernels are faster on the H200 (bench/HISTORY.md, issue 23's fifth round); $STRATA_MMQ_FROM
# overrides it (a benchmark's way to put both kernels side by side)
MMQ_THREADS, MMQ_MT, MMQ_STAGES = 512, 2, 4  # an mmq block: MMQ_WARPS warps, 16 MMQ_MT weight rows, the most slabs
# in flight (as many as fit MMQ_SMEM)
MMQ_SMEM = 227 * 1024  # shared memory an mmq block may take (kSmemBudget in mmq.cu; the H200's most a block)
MMQ_TILES = (1, 2, 4)  # n-tiles of 8 rows of x a block takes (mmq_<T>_t<NT>); more rows, more blocks
MMV_THREADS = 128  # mmv.cu: a block's threads
MMV_TILE_ROWS = {1: 16, 2: 16, 4: 32, 8: 32}  # n-tiles of 8 rows of x (mmv_f16_t<NT>, up to 64 rows a launch) ->
# weight rows a block takes (16 mmv_tiles<NT>() in mmv.cu)
NORM_MAX_WIDTH = 8 * 256 * 6  # add_rms_norm: eight values a thread, six times, 256 threads (NORM_OCTETS)
Q8_BYTES = 48  # one unit of an activation in 8 bits: sizeof(Q8) in q8.cuh
NULL = np.uint64(0)  # a null pointer argument


def matvec_rows(nb: int) -> int:
    """Weight rows a block of matvec_<T>_n<nb> takes."""
    return MATVEC_SOLO_ROWS if nb == 1 else MATVEC_ROWS


def matvec_stage(kind: str, m: int, k: int, nb: int, address: int) -> int:
    """Shared memory a warp of matvec_<kind>_n<nb> over an (m, k) matrix stages its rows in (the
    kernel's `stage`), or 0 to read them from global memory: small matrices against one row of x only,
    and a bulk copy takes 16-byte aligned runs of whole 16-byte pieces."""
    if nb != 1:
        return 0
    per_warp = matvec_rows(nb) // (MATVEC_THREADS // 32) * row_bytes(kind, k)
    fits = per_warp * (MATVEC_THREADS // 32) <= MATVEC_STAGE_MAX and m * row_bytes(kind, k) <= MATVEC_STAGE_MATRIX
    return per_warp if fits and per_warp % 16 == 0 and address % 16 == 0 else 0


def mmq_stages(kind: str, nt: int, warps: int = MMQ_THREADS // 32, mt: int = MMQ_MT,
               stages: int = MMQ_STAGES) -> tuple[int, int, int]:
    """An mmq_<kind>_t<nt> block's shared memory (mmq.cu's Smem) -> (stages, bytes a stage, bytes of
    the sums): a stage is a slab of 32 units of its 16 mt weight rows (row_stride: the slab's bytes,
    their 16-byte pieces' slack, padded to 16 past a multiple of 128) and of its 8 nt rows of x (32 Q8
    units and 16 bytes); the warps' sums take min(outputs a lane, warps) outputs a lane at a time; as
    many stages as fit MMQ_SMEM beside them, at most `stages`."""
    size, nbytes = BLOCKS[kind]
    slab = 32 * UNIT // size * nbytes
    row_stride = (slab + 32 + 127) // 128 * 128 + 16
    stage = 16 * mt * row_stride + 8 * nt * (32 * Q8_BYTES + 16)
    sums = warps * min(mt * nt * 4, warps) * 32 * 4
    return min(stages, (MMQ_SMEM - sums) // stage), stage, sums


def mmq_smem_bytes(kind: str, nt: int, warps: int = MMQ_THREADS // 32, mt: int = MMQ_MT,
                   stages: int = MMQ_STAGES) -> int:
    """Dynamic shared memory of an mmq_<kind>_t<nt> block: its stages and its sums (mmq_stages)."""
    n, stage, sums = mmq_stages(kind, nt, warps, mt, stages)
    return n * stage + sums


def mmq_grid(m: int, n: int, nt: int, sms: int, mt: int = MMQ_MT) -> int:
    """Blocks of an mmq launch over an (m, k) matrix and n rows of x: one a multiprocessor, or one a
    tile of 16 mt weight rows by 8 nt rows of x where there are fewer tiles (mmq.cu walks the rest)."""
    return min(sms, math.ceil(m / (16 * mt)) * math.ceil(n / (8 * nt)))


def built_kernels() -> dict[str, tuple[str, ...]]:
    """The kernels GpuKernels builds (compiled by CuPy), by source file."""
    return {"norm_rope.cu": ("add_rms_norm", "rope_store", "norm_rope_store", "silu_mul"), "argmax.cu": ("argmax_first",),
             "quant.cu": ("dequant_BF16", "quantize_q8", *(f"{family}_{kind}{suffix}" for kind in WEIGHT_KINDS
                                            for family, suffix in (("dequant", ""), ("embed", ""))),
                          *(f"matvec_{kind}_n{nb}{suffix}" for kind in BLOCKS
                            for nb in range(1, MAX_BATCH_ROWS + 1) for suffix in ("", "_f32")),
                          *(f"matvec2_{a}_{b}" for a, b in MATVEC_PAIRS)),
             "attention.cu": (*(f"flash_attention_d{d}" for d in HEAD_DIMS), "widen_q8_0_blocks",
                              *(f"flash_decode{kind}_d{d}_g{g}" for kind in ("", "_q8") for d in HEAD_DIMS
                                for g in range(1, MAX_GROUP + 1))),
             "mmv.cu": tuple(f"mmv_f16_t{nt}{suffix}" for nt in MMV_TILE_ROWS for suffix in ("", "_f32")),
             "mmq.cu": tuple(f"mmq_{kind}_t{nt}{suffix}" for kind in BLOCKS for nt in MMQ_TILES for suffix in ("", "_f32")),
             "moe.cu": moe.KERNELS}


def find_function(modules, name: str):
    """The kernel `name` from the first of a file's parts that has it (parts.cuh)."""
    for module in modules[:-1]:
        try:
            return module.get_function(name)
        except Exception:  # CuPy's error for a name this part does not hold: the next part
            continue
    return modules[-1].get_function(name)


def is_dependent(kernel: str) -> bool:
    """Whether a kernel waits for its producers in after_producer() (pdl.cuh) before it reads or
    writes anything, so that a decode graph may launch it while the kernel before it runs: every
    kernel of a decode step (tests/engine/kernels/test_kernel_sources.py checks their sources); not the
    prompt chunks' attention."""
    return not kernel.startswith("flash_attention")


def attention_smem_bytes(d: int) -> int:
    """Two stages of a 64-key K tile and V tile, rows padded by 8 halves: Tiles<D>::BYTES."""
    return 2 * 2 * 64 * (d + 8) * 2


def decode_keys_per_block(keys: int) -> int:
    """Keys one flash-decoding block reads: 64 (a round of 16 for each of its 4 warps) up to
    DECODE_SPLITS x 64 keys, then the fewest multiple of 64 that cuts them in at most DECODE_SPLITS
    (attention.cu computes the same from the sequence's own length)."""
    return 64 * max(1, -(-keys // (DECODE_SPLITS * 64)))


def decode_splits(keys: int) -> int:
    """Blocks per K/V head a flash-decoding grid needs so that any sequence of up to `keys` keys
    finds all of its splits in it."""
    return min(DECODE_SPLITS, math.ceil(keys / 64))


def decode_blocks_x(splits: int, seqs: int, blocks_y: int, sms: int) -> int:
    """Blocks per (sequence, K/V head group) of a flash-decoding grid of `splits` splits: one a split
    while the grid has up to DECODE_BLOCKS_PER_SM blocks a multiprocessor; beyond, each block takes
    several splits in turn (the same partials, merged alike: attention.cu)."""
    per_block = max(1, seqs * blocks_y * splits // (DECODE_BLOCKS_PER_SM * sms))
    return math.ceil(splits / min(per_block, splits))


def log2(block: int) -> np.int32:
    """A KV block size's exponent (block sizes are powers of two: engine/cli.py)."""
    return np.int32(block.bit_length() - 1)


def tiles(rows: int, choices=MMV_TILE_ROWS) -> int:
    """The fewest n-tiles of 8 that hold `rows` rows of x."""
    return next(t for t in choices if 8 * t >= rows)


def pool_args(k_cache, v_cache) -> tuple:
    """A layer's K and V pools as the kernels take them: the values, then the q8_0 scales (null for fp16)."""
    if isinstance(k_cache, Q8Array):
        return k_cache.q, v_cache.q, k_cache.scale, v_cache.scale
    return k_cache, v_cache, NULL, NULL


def blocks(n: int, per_block: int = THREADS) -> tuple[int]:
    return (max(1, math.ceil(n / per_block)),)


class GpuKernels:
    def __init__(self, cp: ModuleType, defines: tuple[str, ...] = (), prompt_attention: str | None = None):
        """defines: NAME=VALUE macros for every kernel file (a tool's way to time a kernel's variants).
        prompt_attention: "sm90" or "mma" (PROMPT_ATTENTION; default $STRATA_PROMPT_ATTENTION, else sm90
        where the device has it)."""
        self.cp = cp
        self.fn = {}  # kernel name -> RawKernel, looked up once (not per launch)
        sources = built_kernels()
        build.prebuild(cp, sources, defines)  # a first start: every part compiled side by side
        for source, kernels in sources.items():
            parts = [build.module(cp, unit, defines) for unit in build.units([source])]
            self.fn |= {name: find_function(parts, name) for name in kernels}
        for d in HEAD_DIMS:  # more than the default 48 KiB of dynamic shared memory
            self.fn[f"flash_attention_d{d}"].max_dynamic_shared_size_bytes = attention_smem_bytes(d)
        self.prompt_attention = self.load_sm90(defines, prompt_attention or os.environ.get("STRATA_PROMPT_ATTENTION"))
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
        # the int8 tensor-core batches (mmq.cu) take up to 227 KiB of shared memory a block: Hopper's
        self.mmq_from = int(os.environ.get("STRATA_MMQ_FROM", MMQ_FROM)) if hopper else sys.maxsize
        self.sms = cp.cuda.Device().attributes["MultiProcessorCount"]
        mmq_smem_max = max(mmq_smem_bytes(kind, nt) for kind in BLOCKS for nt in MMQ_TILES)  # a cap: each launch
        # asks for its kind's and tile's share
        for name, fn in self.fn.items():
            if name.startswith("matvec"):
                fn.max_dynamic_shared_size_bytes = MATVEC_STAGE_MAX
            if name.startswith("mmq") and hopper:
                fn.max_dynamic_shared_size_bytes = mmq_smem_max
            if is_dependent(name):
                self.fn[name] = launch.Kernel(fn, self, fn.kernel.ptr)
        # flash-decoding's per-(sequence, K/V head group) block counters, int32, zero at rest; made here
        # with the default allocator, never in a graphs' pool: every captured graph keeps their address
        self.counters = cp.zeros(COUNTER_SEQUENCES * MAX_COUNTER_HEADS, dtype=cp.int32)
        self.scratch = None  # fp16 values of the largest quantized matrix: a prompt chunk's GEMM operand
        self.moe = moe.MoeKernels(self)

    def load_sm90(self, defines: tuple[str, ...], wanted: str | None) -> str:
        """The prompt-attention kernel to use: "sm90" once attention_sm90.cu is built (compute
        capability 9.0 only), else "mma". A device that has it but cannot build it (an NVRTC older
        than CUDA 12) says so and runs the mma.sync kernel."""
        if wanted not in (None, *PROMPT_ATTENTION):
            raise ValueError(f"prompt attention kernel {wanted!r}: choose one of {PROMPT_ATTENTION}")
        if wanted == "mma" or not sm90.supported(self.cp):
            if wanted == "sm90":
                raise ValueError("the sm90 attention kernel needs a GPU of compute capability 9.0 (Hopper)")
            return "mma"
        names = tuple(f"flash_attention_sm90_d{d}" for d in HEAD_DIMS)
        try:
            built = sm90.Sm90Kernels(self.cp, kernel_source("attention_sm90.cu"), "attention_sm90.cu", names,
                                     OPTIONS + tuple(f"-D{d}" for d in defines),
                                     {f"flash_attention_sm90_d{d}": sm90.smem_bytes(d) for d in HEAD_DIMS})
        except RuntimeError as e:
            if wanted == "sm90":
                raise
            print(f"prompt attention: {e.args[0].splitlines()[0]}; using the mma.sync kernel", file=sys.stderr)
            return "mma"
        self.sm90_module = built  # kept: its functions live as long as it does
        self.fn |= built.fn
        return "sm90"

    # ------------------------------------------------------------ norm, RoPE, SwiGLU (a row at a time: batch-invariant)

    def add_rms_norm(self, x, delta, weight, eps: float, q8: bool = False):
        """x: (n, dim) fp32, updated in place by += delta (n, dim) fp16 if given; returns
        rms_norm(x) * weight as (n, dim) fp16, or for q8 a Row8 (n == 1) with its 8-bit form."""
        n, dim = x.shape
        if dim % UNIT:
            raise ValueError(f"a row width of {dim} is not a multiple of {UNIT} (the kernels read 32 values at a time)")
        if dim > NORM_MAX_WIDTH:
            raise ValueError(f"a row width of {dim} is wider than the norm kernel's {NORM_MAX_WIDTH}")
        out = self.cp.empty((n, dim), dtype=self.cp.float16)
        units = self.cp.empty((n * dim // UNIT, Q8_BYTES), dtype=self.cp.uint8) if q8 else None
        has_delta = delta is not None
        self.fn["add_rms_norm"](
            (n,), (THREADS,), (x, delta if has_delta else out, np.int32(has_delta), weight, out,
                               units if q8 else NULL, np.int32(dim), np.float32(eps)))
        return Row8(out, units) if q8 else out

    def rope_store(self, qkv, cos_table, sin_table, k_cache, v_cache, step: Step, norms=None):
        """qkv: (n, (heads + 2*kv_heads) * d) fp16; cos/sin tables: (positions, 1, d/2) fp32;
        k_cache/v_cache: a layer's pool (blocks, kv_heads, block, d), fp16 or a Q8Array (q8_0, quantized
        as written), the rows of positions start..start+n written through the step's block table
        (start read from the step's device copy); for a decode batch, row i at its own position
        through its own table. norms:
        (q_weight, k_weight, eps) to RMS-normalize each Q and K head first (Qwen3), in the same
        kernel. Returns q (n, heads, d)."""
        _, kv_heads, block, d = k_cache.shape
        n = qkv.shape[0]
        heads = qkv.shape[1] // d - 2 * kv_heads
        q = self.cp.empty((n, heads, d), dtype=self.cp.float16)
        common = (qkv, q, *pool_args(k_cache, v_cache), cos_table, sin_table, step.pos0, step.table, step.table_off,
                  np.int32(n if step.batch else 1))
        if norms is None:
            total = n * (heads + 2 * kv_heads) * (d // 2)
            self.fn["rope_store"](blocks(total), (THREADS,), (*common, np.int32(n), np.int32(heads),
                                                               np.int32(kv_heads), np.int32(d), log2(block)))
        else:
            q_weight, k_weight, eps = norms
            self.fn["norm_rope_store"](blocks(n * (heads + 2 * kv_heads), 4), (128,),
                                       (*common, q_weight, k_weight, np.int32(n), np.int32(heads), np.int32(kv_heads),
                                        np.int32(d), log2(block), np.float32(eps)))
        return q

    def silu_mul(self, gate_up, q8: bool = False):
        """gate_up: (n, 2*ffn) fp16 -> silu(gate) * up: (n, ffn) fp16 (a Row8 with q8)."""
        n, two_ffn = gate_up.shape
        out = self.cp.empty((n, two_ffn // 2), dtype=self.cp.float16)
        if (two_ffn // 2) % UNIT:
            raise ValueError(f"an FFN width of {two_ffn // 2} is not a multiple of {UNIT}")
        units = self.cp.empty((out.size // UNIT, Q8_BYTES), dtype=self.cp.uint8) if q8 else None
        octets = out.size // 8
        self.fn["silu_mul"](blocks(octets), (THREADS,), (gate_up, out, units if q8 else NULL, np.int32(two_ffn // 2),
                                                         np.int64(octets)))
        return Row8(out, units) if q8 else out

    def argmax(self, logits):
        """logits: (rows, n) fp32 -> (rows,) int64 on the device: each row's first index of its
        maximum (numpy.argmax)."""
        logits = logits.reshape(-1, logits.shape[-1])
        out = self.cp.empty(logits.shape[0], dtype=self.cp.int64)
        self.fn["argmax_first"]((logits.shape[0],), (1024,), (logits, out, np.int32(logits.shape[1])))
        return out

    # ------------------------------------------------------------ attention

    def attention(self, q, k_cache, v_cache, step: Step, q8: bool = False):
        """q: (n, heads, d) fp16 at positions start..start+n; k_cache/v_cache: a layer's pool
        (blocks, kv_heads, block, d), fp16 or a Q8Array, the sequence's rows 0..start+n filled
        (through its block table). Causal flash attention; returns (n, heads*d) fp16. A decode step
        (one token, or a batch of sequences with one token each) goes to flash-decoding (the keys
        split across blocks; a Row8 with q8), which reads a q8_0 pool as it is; a prompt chunk's
        kernel reads its sequence's q8_0 rows widened to fp16 (widen_q8_0)."""
        cp = self.cp
        n, heads, d = q.shape
        _, kv_heads, block, _ = k_cache.shape
        if d not in HEAD_DIMS:
            raise ValueError(f"head width {d} is not supported on the GPU (supported: {HEAD_DIMS})")
        if step.decode:
            return self.decode_attention(q, k_cache, v_cache, step, q8)
        table, table_off = step.table, step.table_off
        if isinstance(k_cache, Q8Array):
            held, table, table_off = self.widened_tables(step, block)
            k_cache, v_cache = self.widen_q8_0(k_cache, held), self.widen_q8_0(v_cache, held)
        out = cp.empty((n, heads, d), dtype=cp.float16)
        rows = n * (heads // kv_heads)
        if self.prompt_attention == "sm90":
            name, per_block, threads, smem = f"flash_attention_sm90_d{d}", sm90.ROWS, sm90.THREADS, sm90.smem_bytes(d)
        else:
            name, per_block, threads, smem = f"flash_attention_d{d}", ATTENTION_ROWS, 128, attention_smem_bytes(d)
        self.fn[name]((math.ceil(rows / per_block), kv_heads, 1), (threads,),
                      (q, k_cache, v_cache, out, step.q_start, step.pos0, table, table_off, np.int32(heads),
                       np.int32(kv_heads), log2(block), np.float32(math.log2(math.e) / math.sqrt(d))), shared_mem=smem)
        return out.reshape(n, heads * d)

    def widened_tables(self, step: Step, block: int) -> tuple:
        """A prompt step over a q8_0 pool: the blocks that hold its sequence's keys (rows
        0..start+n), and the table and offset the kernel reads them by once widened (the identity),
        on the device; made once per forward (every layer's chunk reads the same blocks)."""
        if step.held is None:
            cp = self.cp
            held = cp.asarray(step.tables[0][: -(-(step.start + step.n) // block)].astype(np.int32))
            step.held = (held, cp.arange(held.size, dtype=cp.int32), cp.zeros(1, dtype=cp.int32))
        return step.held

    def widen_q8_0(self, pool: Q8Array, held):
        """A layer's q8_0 pool -> its blocks `held` (count,) in fp16: (count, kv_heads, block, d), in
        that order (NumPy reference: Q8Array.dequantize of pool[held])."""
        _, kv_heads, block, d = pool.shape
        out = self.cp.empty((held.size, kv_heads, block, d), dtype=self.cp.float16)
        octets = out.size // 8
        self.fn["widen_q8_0_blocks"](blocks(octets), (THREADS,), (pool.q, pool.scale, out, held, np.int64(octets),
                                                                  np.int64(kv_heads * block * d)))
        return out

    def decode_attention(self, q, k_cache, v_cache, step: Step, q8: bool = False):
        """One query token per sequence (q: (sequences, heads, d)): blocks of keys, their partials
        merged by the last block to finish. Each sequence splits its keys by its own length
        (decode_keys_per_block, in the kernel), so its result does not depend on the batch beside it
        or on the graph bucket; the grid covers the most splits any length up to step.max_keys (a
        graph's bucket) or the longest sequence present can use. With q8, a Row8 (the output in 8
        bits too)."""
        cp = self.cp
        seqs, heads, d = q.shape
        _, kv_heads, block, _ = k_cache.shape
        group = heads // kv_heads
        if group > MAX_GROUP:
            raise ValueError(f"{group} query heads per K/V head (at most {MAX_GROUP} supported)")
        kv_div = 2 if group > 4 and group % 2 == 0 else 1  # 8 heads a block spill registers: two blocks of 4
        group, blocks_y = group // kv_div, kv_heads * kv_div
        keys = step.max_keys or (max(step.positions) + 1 if step.batch else step.start + 1)
        splits = decode_splits(keys)
        part_o = cp.empty((seqs, heads, splits, d), dtype=cp.float32)
        part_ml = cp.empty((seqs, heads, splits, 2), dtype=cp.float32)
        out = cp.empty((seqs, heads, d), dtype=cp.float16)
        units = cp.empty((seqs * heads * d // UNIT, Q8_BYTES), dtype=cp.uint8) if q8 else None
        if self.counters.size < seqs * blocks_y:
            raise ValueError(f"a decode batch of {seqs} sequences exceeds the {COUNTER_SEQUENCES} the kernels hold")
        kind = "_q8" if isinstance(k_cache, Q8Array) else ""
        self.fn[f"flash_decode{kind}_d{d}_g{group}"](
            (decode_blocks_x(splits, seqs, blocks_y, self.sms), blocks_y, seqs), (DECODE_THREADS,),
            (q, *pool_args(k_cache, v_cache), part_o, part_ml, out, units if q8 else NULL, self.counters, step.pos0, step.table,
             step.table_off, np.int32(blocks_y), np.int32(kv_div), log2(block),
             np.float32(math.log2(math.e) / math.sqrt(d)), np.int32(splits)))
        out = out.reshape(seqs, heads * d)
        return Row8(out, units) if q8 else out

    def step(self, n: int, start: int, table=None) -> Step:
        """The kernels' description of one sequence's n tokens at `start`, its rows through `table`
        (its block table); every layer of a forward reuses it (one small copy to the device per
        forward)."""
        table = np.asarray(table if table is not None else [0], dtype=np.int32)
        return self.device_step(n, start, table)

    def batch_step(self, tables, positions: tuple[int, ...], max_keys: int | None = None,
                   block: int | None = None) -> Step:
        """A decode batch: row i is the next token of the sequence whose block table is tables[i],
        at positions[i]. With max_keys (and the pool's block size), a graph's step whose rows are
        set in place (Step.set_rows) before each replay: each table gets max_keys / block entries."""
        cp, n = self.cp, len(tables)
        width = -(-max_keys // block) if max_keys is not None else max(len(t) for t in tables)
        step = Step(n, -1, tuple(tables), tuple(positions), q_start=cp.arange(n + 1, dtype=cp.int32),
                    pos0=cp.empty(n, dtype=cp.int32), table=cp.empty(n * width, dtype=cp.int32),
                    table_off=cp.arange(0, n * width, width, dtype=cp.int32), max_keys=max_keys)
        step.set_rows(tables, positions)
        return step

    def device_step(self, n: int, start: int, table: np.ndarray, max_keys: int | None = None) -> Step:
        cp = self.cp
        return Step(n, start, (table,), q_start=cp.asarray(np.array([0, n], dtype=np.int32)),
                    pos0=cp.asarray(np.array([start], dtype=np.int32)), table=cp.asarray(table),
                    table_off=cp.zeros(1, dtype=cp.int32), max_keys=max_keys)

    # ------------------------------------------------------------ weights: rows, blocks

    def matvec(self, w, x, dtype=np.float32, q8=None):
        """w: (m, k) fp16 or a QuantMatrix (its blocks read directly), x: (n, k) fp16 rows (or one
        row (k,)) -> (n, m) (or (m,)) in dtype (float32 or float16), fp32 accumulation; each row of
        x reduced as it would be alone (batch-invariant). Quantized parts take x in 8 bits per 32
        values (q8: the Q8 units the producer of x wrote, else quantize_q8 runs once for all parts)
        and integer dot products."""
        one = x.ndim == 1
        x = self.cp.ascontiguousarray(x.reshape(-1, x.shape[-1]))
        n, (m, k) = x.shape[0], w.shape
        suffix = "_f32" if np.dtype(dtype) == np.float32 else ""
        y = self.cp.empty((n, m), dtype=dtype)
        parts = self.parts(w)
        xq = q8 if q8 is not None or all(kind == "F16" for kind, _, _ in parts) else self.quantize_q8(x.reshape(-1))
        if n == 1 and suffix == "" and self.pairs and tuple(kind for kind, _, _ in parts) in MATVEC_PAIRS:
            self.matvec_pair(parts, xq, y, k)
            return y[0] if one else y
        row = 0
        for kind, data, rows in parts:
            if kind == "F16":  # tensor cores (mmv.cu), up to 64 rows of x a launch
                for b0 in range(0, n, 8 * max(MMV_TILE_ROWS)):
                    nb = min(8 * max(MMV_TILE_ROWS), n - b0)
                    nt = tiles(nb)
                    self.fn[f"mmv_f16_t{nt}{suffix}"](
                        blocks(rows, MMV_TILE_ROWS[nt]), (MMV_THREADS,),
                        (data, x[b0:], y[b0:, row:], np.int32(rows), np.int32(k), np.int32(m), np.int32(nb)))
            elif n >= self.mmq_from:
                self.mmq(kind, data, rows, k, xq, y[:, row:], m, n, suffix)
            else:
                self.matvec_dp4a(kind, data, rows, k, xq, y[:, row:], m, n, suffix)
            row += rows
        return y[0] if one else y

    def matvec_dp4a(self, kind: str, data, m: int, k: int, xq, y, ldy: int, n: int, suffix: str = "") -> None:
        """y (n, m; rows ldy apart) = x @ W^T for n rows of x in 8 bits (xq) against an (m, k) matrix of
        `kind` blocks by the CUDA-core dp4a kernels, MAX_BATCH_ROWS rows of x a launch."""
        units = k // UNIT
        for b0 in range(0, n, MAX_BATCH_ROWS):
            nb = min(MAX_BATCH_ROWS, n - b0)
            stage = self.stage_bytes(kind, data, m, k, nb)
            self.fn[f"matvec_{kind}_n{nb}{suffix}"](blocks(m, matvec_rows(nb)), (MATVEC_THREADS,),
                                                     (data, xq[b0 * units :], y[b0:], np.int32(m), np.int32(k),
                                                      np.int32(ldy), np.int32(stage)),
                                                     shared_mem=stage * (MATVEC_THREADS // 32))

    def mmq(self, kind: str, data, m: int, k: int, xq, y, ldy: int, n: int, suffix: str = "") -> None:
        """y (n, m; rows ldy apart) = x @ W^T for n rows of x in 8 bits (xq) against an (m, k) matrix of
        `kind` blocks on the int8 tensor cores, one launch: the bits matvec_<kind>_n<NB> gives each row."""
        nt = tiles(min(n, 8 * MMQ_TILES[-1]), MMQ_TILES)
        self.fn[f"mmq_{kind}_t{nt}{suffix}"]((mmq_grid(m, n, nt, self.sms),), (MMQ_THREADS,),
                                             (data, xq, y, np.int32(m), np.int32(k), np.int32(ldy), np.int32(n)),
                                             shared_mem=mmq_smem_bytes(kind, nt))

    def stage_bytes(self, kind: str, data, rows: int, k: int, nb: int) -> int:
        """The `stage` argument of matvec_<kind>_n<nb> over the (rows, k) blocks `data`: matvec_stage's
        bytes a warp, 0 with staging off."""
        return matvec_stage(kind, rows, k, nb, data.data.ptr) if self.stage else 0

    def matvec_pair(self, parts, xq, y, k: int) -> None:
        """y (1, ma + mb) fp16 = x @ [A; B]^T for two quantized parts (kinds a MATVEC_PAIRS entry), one launch."""
        (kind_a, wa, ma), (kind_b, wb, mb) = parts
        grid_a, grid_b = blocks(ma, matvec_rows(1))[0], blocks(mb, matvec_rows(1))[0]
        stage_a, stage_b = (self.stage_bytes(kind, data, rows, k, 1) for kind, data, rows in parts)
        self.fn[f"matvec2_{kind_a}_{kind_b}"]((grid_a + grid_b,), (MATVEC_THREADS,),
                                              (wa, wb, xq, y, np.int32(ma), np.int32(mb), np.int32(k), np.int32(grid_a),
                                               np.int32(stage_a), np.int32(stage_b)),
                                              shared_mem=max(stage_a, stage_b) * (MATVEC_THREADS // 32))

    def quantize_q8(self, x):
        """x: (k,) fp16 -> k / 32 units of 48 bytes (Q8 in quant.cu): 32 int8, the scale and the
        halves' sums. NumPy reference: engine.core.quantized.quantize_q8."""
        units = x.shape[0] // UNIT
        out = self.cp.empty((units, Q8_BYTES), dtype=self.cp.uint8)
        self.fn["quantize_q8"](blocks(units), (THREADS,), (x, out, np.int32(units)))
        return out

    @staticmethod
    def parts(w):
        if isinstance(w, QuantMatrix):
            return [(p.kind, p.data, p.rows) for p in w.parts]
        return [("F16", w, w.shape[0])]

    def embed(self, table: QuantMatrix, tokens):
        """Rows `tokens` (n,) of a quantized (vocab, dim) table -> (n, dim) fp32."""
        (part,) = table.parts
        ids = self.cp.asarray(tokens, dtype=self.cp.int64)
        out = self.cp.empty((ids.shape[0], table.cols), dtype=self.cp.float32)
        units = out.size // UNIT
        self.fn[f"embed_{part.kind}"](blocks(units), (THREADS,), (part.data, ids, out, np.int64(units),
                                                                  np.int32(table.cols)))
        return out

    def reserve_scratch(self, values: int) -> None:
        """Room for the largest quantized matrix in fp16, allocated once at load."""
        if self.scratch is None or self.scratch.size < values:
            self.scratch = None
            self.scratch = self.cp.empty(values, dtype=self.cp.float16)

    def expand(self, w: QuantMatrix):
        """A quantized matrix -> (rows, cols) fp16 in the scratch (valid until the next expand)."""
        out = self.scratch[: w.rows * w.cols].reshape(w.rows, w.cols)
        row = 0
        for kind, data, rows in self.parts(w):
            units = rows * w.cols // UNIT
            self.fn[f"dequant_{kind}"](blocks(units), (THREADS,), (data, out[row:], np.int64(units), np.int32(w.cols)))
            row += rows
        return out

    # ------------------------------------------------------------ load-time dequantization

    def dequantize(self, raw, type_name: str, shape: tuple[int, int]):
        """raw: the tensor's GGUF bytes (a host array, e.g. the memory-mapped file) -> (rows, cols)
        fp16 on the device. Only the raw bytes cross the bus."""
        src = self.cp.asarray(np.ascontiguousarray(raw))
        out = self.cp.empty(shape, dtype=self.cp.float16)
        if type_name == "BF16":
            self.fn["dequant_BF16"](blocks(out.size), (THREADS,), (src, out, np.int64(out.size)))
        else:
            units = out.size // UNIT
            self.fn[f"dequant_{type_name}"](blocks(units), (THREADS,), (src, out, np.int64(units), np.int32(shape[1])))
        return out
