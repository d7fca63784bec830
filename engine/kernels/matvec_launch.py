"""Launchers of the weights-times-rows kernels: quant.cu's matvec_ (dp4a, rows of x in 8 bits:
quantize_q8) and matvec2_ (two stacked parts in one launch), mmq.cu (int8 tensor cores, from MMQ_FROM
rows), mmv.cu (fp16 weights on the tensor cores), sbq.cu (issue 48's super-block order, opt-in: $STRATA_SBQ=1);
and the geometry of their blocks."""
from __future__ import annotations

import math
import os
from types import ModuleType

import numpy as np

from engine.core.quantized import BLOCKS, UNIT, QuantMatrix, row_bytes
from engine.kernels.args import NULL, q8k_blocks
from engine.kernels.limits import MATVEC_ROWS, MATVEC_THREADS, Q8_BYTES, THREADS, blocks

MATVEC_SOLO_ROWS = 4  # a block's rows at one row of x: MV_WARPS warps of MV_SOLO_ROWS rows
MATVEC_STAGE_MAX = 64 * 1024  # shared memory a matvec block may stage its weight rows in (quant.cu, stage.cuh):
# more, and too few blocks fit an SM to keep its memory busy; such launches read the rows directly
MATVEC_STAGE_MATRIX = 4 << 20  # matrices of at most these bytes are staged: their launch is mostly waiting,
# and the bulk copies start before the kernel before them ends; larger ones were slower staged (a warp
# waits for its whole row, then computes with nothing of its own in flight: bench/HISTORY.md)
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
SBQ_KINDS = ("Q4_K", "Q6_K")  # sbq.cu's kinds: a matrix all of them takes it where GpuKernels.sbq is set
SBQ_WARPS, SBQ_TILES = 4, (1, 2, 4, 8)  # sbq.cu: warps a block, n-tiles a kernel
SBQ_TILE_WARPS, SBQ_MAX_PARTS = 2048, 8  # sbq.cu's split of k: segments enough for a matrix's 16-row tiles to make
# about this many warps, at most so many (sbq_parts)
MMV_THREADS = 128  # mmv.cu: a block's threads
MMV_TILE_ROWS = {1: 16, 2: 16, 4: 32, 8: 32}  # n-tiles of 8 rows of x (mmv_f16_t<NT>, up to 64 rows a launch) ->
# weight rows a block takes (16 mmv_tiles<NT>() in mmv.cu)


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


def sbq_wanted() -> bool:
    """Whether $STRATA_SBQ asks for sbq.cu's super-block order (issue 48's probe, off by default)."""
    return os.environ.get("STRATA_SBQ", "0") == "1"


def sbq_parts(m: int, k: int) -> int:
    """The segments of k that sbq.cu's kernels split an (m, k) matrix into (a chain each, added in order after):
    enough for its 16-row tiles to make SBQ_TILE_WARPS warps, at most SBQ_MAX_PARTS and k's super-blocks. A choice
    of the matrix's shape alone: one row and a batch's rows take the same segments, so the same bits."""
    return max(1, min(SBQ_MAX_PARTS, k // 256, math.ceil(SBQ_TILE_WARPS / math.ceil(m / 16))))


def sbq_segments(k: int, parts: int) -> tuple[int, int]:
    """(super-blocks a segment, segments) of k split in `parts` (at most k's super-blocks; the last segment shorter
    where they do not divide, and fewer segments where the rounding up leaves one empty)."""
    blocks = k // 256
    seg = -(-blocks // min(parts, blocks))
    return seg, -(-blocks // seg)


def tiles(rows: int, choices=MMV_TILE_ROWS) -> int:
    """The fewest n-tiles of 8 that hold `rows` rows of x."""
    return next(t for t in choices if 8 * t >= rows)


class MatvecLaunchers:
    """Mixed into GpuKernels, which sets what these read: cp (CuPy), fn (kernel name -> function),
    sms (the device's multiprocessors) and the paths a matvec may take: stage (weight rows staged in
    shared memory), pairs (matvec2_), mmq_from (rows of x from which mmq.cu runs), sbq (sbq.cu for the
    matrices whose parts are all of SBQ_KINDS)."""

    cp: ModuleType
    fn: dict
    sms: int
    stage: bool
    pairs: bool
    mmq_from: int
    sbq = False

    def matvec(self, w, x, dtype=np.float32, q8=None, q8k=None):
        """w: (m, k) fp16 or a QuantMatrix (its blocks read directly), x: (n, k) fp16 rows (or one
        row (k,)) -> (n, m) (or (m,)) in dtype (float32 or float16), fp32 accumulation; each row of
        x reduced as it would be alone (batch-invariant). Quantized parts take x in 8 bits per 32
        values (q8: the Q8 units the producer of x wrote, else quantize_q8 runs once for all parts)
        and integer dot products; with sbq, in Q8K (q8k: the producer's super-blocks, else quantize_q8k once)."""
        if x.dtype != self.cp.float16:  # (the kernels read x's bytes as halves: float32 rows gave numbers 50x off)
            raise TypeError(f"matvec takes rows of x in float16, not {x.dtype}")
        one = x.ndim == 1
        x = self.cp.ascontiguousarray(x.reshape(-1, x.shape[-1]))
        n, (m, k) = x.shape[0], w.shape
        suffix = "_f32" if np.dtype(dtype) == np.float32 else ""
        y = self.cp.empty((n, m), dtype=dtype)
        parts = self.parts(w)
        if self.sbq and all(kind in SBQ_KINDS for kind, _, _ in parts):
            xk, row = q8k if q8k is not None else self.quantize_q8k(x), 0
            for kind, data, rows in parts:
                self.sbq_matvec(kind, data, rows, k, xk, y[:, row:], m, n, suffix)
                row += rows
            return y[0] if one else y
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

    def sbq_matvec(self, kind: str, data, m: int, k: int, xk, y, ldy: int, n: int, suffix: str = "") -> None:
        """y (n, m; rows ldy apart) = x @ W^T for n rows of x in Q8K (xk: (n, k / 256, 288) bytes, quantize_q8k)
        against an (m, k) matrix of `kind` blocks in the super-block order (sbq.cu), k in sbq_parts(m, k) segments:
        one row by its solo kernel, more by the int8 tensor cores, 64 a launch (each segment's sums into a float32
        buffer, added in order by sbq_sum_parts), each row the solo kernel's bits."""
        seg, z = sbq_segments(k, sbq_parts(m, k))
        if n == 1:
            self.fn[f"sbq_{kind}_n1{suffix}"](blocks(m, SBQ_WARPS), (32 * SBQ_WARPS,),
                                               (data, xk, y, np.int32(m), np.int32(k), np.int32(seg)))
            return
        for b0 in range(0, n, 8 * SBQ_TILES[-1]):
            nb = min(8 * SBQ_TILES[-1], n - b0)
            part = self.cp.empty((z, nb, m), dtype=self.cp.float32) if z > 1 else NULL  # (z, nb, m)
            self.fn[f"sbq_{kind}_t{tiles(nb, SBQ_TILES)}{suffix}"](
                (*blocks(m, 16 * SBQ_WARPS), 1, z), (32 * SBQ_WARPS,),
                (data, xk[b0:], y[b0:], np.int32(m), np.int32(k), np.int32(ldy), np.int32(nb), np.int32(seg), part))
            if z > 1:
                self.fn[f"sbq_sum_parts{suffix}"](blocks(nb * m, 256), (256,),
                                                  (part, y[b0:], np.int32(m), np.int32(nb), np.int32(ldy), np.int32(z)))

    def quantize_q8k(self, x):
        """x: (n, k) fp16 rows -> (n, k / 256, 288) Q8K blocks (sbq.cu): a float scale a super-block, int8 values,
        each unit of 32's sum. NumPy reference: tools/device/sbq_check.py q8k."""
        n, k = x.shape
        out = q8k_blocks(self.cp, n, k, True)
        count = n * k // 256
        self.fn["quantize_q8k"](blocks(32 * count, 128), (128,), (x, out, np.int32(count)))
        return out

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
