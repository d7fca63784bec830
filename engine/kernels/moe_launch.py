"""Launchers of the mixture-of-experts kernels (moe.cu): routing on the device, a decode row's
chosen experts read in their blocks, a prompt chunk's rows grouped by expert for tensor-core
GEMMs. Nothing here waits for the GPU or reads a device value on the host, so a decode step of a
MoE model is captured in one graph like any other. NumPy reference: engine/ops/moe.py."""
from __future__ import annotations

import math
import os

import numpy as np

from engine.kernels.limits import COUNTER_SEQUENCES, MATVEC_ROWS, MATVEC_THREADS
from engine.kernels.args import address, q8_units
from engine.core.experts import Experts, ExpertStack
from engine.core.quantized import UNIT, Row8

MAX_EXPERTS, MAX_USED = 512, 32  # MAX_EXPERTS in moe.cu (16 router values a lane); one lane per choice
GEMM_BM, GEMM_BN, GEMM_THREADS = 64, 64, 128  # moe.cu's grouped GEMM tiles
ROUTER_THREADS = 128  # moe.cu's: a block per (expert, token)
WEIGHT_KINDS = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K", "IQ2_XXS", "IQ2_XS", "IQ2_S",
                "IQ3_XXS", "IQ3_S", "IQ4_NL", "IQ4_XS", "F16")  # moe_*_<kind> kernels
KERNELS = ("router_gemm", "moe_route", "router_route", "moe_sort", "moe_combine",
           *(f"moe_{family}_{kind}" for kind in WEIGHT_KINDS for family in ("matvec", "down", "gemm")),
           *(f"moe_act_{kind}" for kind in WEIGHT_KINDS if kind != "F16"))


ROUTE_TILE, ROUTE_K, ROUTE_THREADS = 64, 32, 256  # moe.cu's router_gemm: a prompt chunk's router logits


def expert_addresses(stack: ExpertStack) -> np.ndarray:
    """(experts,) uint64: where each of a stack's experts starts in its data (the experts one after another), as
    moe.cu's Table holds them."""
    return np.uint64(address(stack.data)) + np.arange(stack.experts, dtype=np.uint64) * np.uint64(stack.expert_bytes)


class MoeKernels:
    def __init__(self, kernels):
        self.kernels, self.cp, self.fn = kernels, kernels.cp, kernels.fn
        self.matvec_rows, self.matvec_threads = MATVEC_ROWS, MATVEC_THREADS
        self.warp_rows = MATVEC_ROWS // (MATVEC_THREADS // 32)  # MV_ROWS
        # router_route's block counters, one a row of a decode step, zero at rest; made here with the
        # default allocator (never in a graphs' pool): every captured graph keeps their address
        self.counters = kernels.cp.zeros(COUNTER_SEQUENCES, dtype=kernels.cp.int32)
        self.tables: dict[tuple, object] = {}  # resident stacks' tables, made at first use (a prompt's, before
        # any graph's capture)
        self.fused_act = os.environ.get("STRATA_MOE_ACT", "0") == "1"  # moe_act, opt-in: the same bits as moe_matvec
        # then silu_mul, but slower on an H100 (30B-A3B shape 378 / 1,178 tok/s at 1 / 16 requests against 408 / 1,383;
        # 80B-A3B 256 / 920 against 277 / 1,014: bench/results/device_round_20261205d/)

    def table(self, stack: ExpertStack):
        """Where the kernels read each expert's rows (moe.cu's Table: (experts,) uint64 device addresses): the
        stack's own (an expert cache's), else its base plus e times an expert's bytes, made once a stack."""
        if stack.table is not None:
            return stack.table
        key = (address(stack.data), stack.experts, stack.expert_bytes)
        if key not in self.tables:
            self.tables[key] = self.cp.asarray(expert_addresses(stack))
        return self.tables[key]

    def route(self, h, router, k: int, normalize: bool, decode: bool = False):
        """h: (n, dim) fp16, router: (experts, dim) fp32 -> chosen (n, k) int32 in descending
        probability and their weights (n, k) fp32, on the device. A decode step's rows in one launch
        (router_route: each row's last block routes it); a prompt chunk's in two (router_gemm, moe_route)."""
        cp = self.cp
        n, dim = h.shape
        experts = router.shape[0]
        if experts > MAX_EXPERTS or k > MAX_USED:
            raise ValueError(f"{experts} experts, {k} used: the GPU routes at most {MAX_EXPERTS}, {MAX_USED}")
        logits = cp.empty((n, experts), dtype=cp.float32)
        chosen = cp.empty((n, k), dtype=cp.int32)
        weights = cp.empty((n, k), dtype=cp.float32)
        if decode:
            if n > self.counters.size:
                raise ValueError(f"a decode step of {n} rows: router_route counts at most {self.counters.size}")
            self.fn["router_route"]((experts, n), (ROUTER_THREADS,), (router, h, logits, self.counters, chosen, weights,
                                                          np.int32(experts), np.int32(dim), np.int32(k), np.int32(normalize)))
            return chosen, weights
        if dim % ROUTE_K:
            raise ValueError(f"a model width of {dim}: the prompt's router reads it {ROUTE_K} columns a step")
        self.fn["router_gemm"]((math.ceil(experts / ROUTE_TILE), math.ceil(n / ROUTE_TILE)), (ROUTE_THREADS,),
                               (router, h, logits, np.int32(n), np.int32(experts), np.int32(dim)))
        self.fn["moe_route"]((n,), (32,), (logits, chosen, weights, np.int32(experts), np.int32(k), np.int32(normalize)))
        return chosen, weights

    def decode(self, h: Row8, experts: Experts, chosen, weights):
        """A decode step's n tokens (h: their normed rows with their 8-bit form): gate and up of each
        token's chosen experts, SwiGLU, then each token's down rows of its chosen experts summed with
        their weights; each kernel one launch for all the tokens. -> (n, dim) fp16. Experts only: the
        chosen (n, k) come from route, on the device."""
        gate, up = experts.gate, experts.up
        fused = self.fused_act and gate.kind == up.kind != "F16"
        act = self.act(h, gate, up, chosen) if fused else self.act_apart(h, experts, chosen)
        return self.down(experts.down, self.operand(experts.down, act), chosen, weights)

    def act(self, h: Row8, gate: ExpertStack, up: ExpertStack, chosen) -> Row8:
        """Each (token, chosen expert)'s SwiGLU activation (n * k, ffn) with its 8-bit form, gate, up and the
        product in one launch (moe_act_<kind>: stacks of one quantized kind): the bits of act_apart's."""
        cp = self.cp
        (n, k), ffn = chosen.shape, gate.rows
        out = cp.empty((n * k, ffn), dtype=cp.float16)
        units = q8_units(cp, n * k * ffn)
        self.fn[f"moe_act_{gate.kind}"]((ffn // UNIT, k, n), (1024,),
                                        (self.table(gate), self.table(up), np.int32(ffn), np.int32(gate.cols), chosen,
                                         np.int32(k), self.operand(gate, h), out, units))
        return Row8(out, units)

    def act_apart(self, h: Row8, experts: Experts, chosen) -> Row8:
        """The same by moe_matvec (gate and up, one launch where their kinds agree) then silu_mul: fp16 stacks,
        or gate and up of two kinds."""
        cp = self.cp
        (n, k), ffn = chosen.shape, experts.gate.rows
        gate_up = cp.empty((n * k, 2 * ffn), dtype=cp.float16)  # a row per (token, chosen expert)
        gate, up = experts.gate, experts.up
        pairs = [(gate, up, gate_up, 2 * k)] if gate.kind == up.kind else [  # one launch for both
            (gate, gate, gate_up, k), (up, up, gate_up[:, ffn:], k)]
        for stack, second, out, grid_y in pairs:
            self.launch("moe_matvec", stack, (grid_y, n),
                        (chosen, np.int32(k), self.operand(stack, h), out, np.int32(2 * ffn)), self.table(second))
        act = self.kernels.silu_mul(gate_up, q8=experts.down.kind != "F16", matvec=False)  # (n * k, ffn)
        return act if isinstance(act, Row8) else Row8(act, None)

    def down(self, stack: ExpertStack, x, chosen, weights):
        """Each token's down rows of its chosen experts summed with their weights, one launch (a
        block on a warp's rows: the experts' rows are short). x: the (token, choice) rows' operand.
        -> (n, stack.rows) fp16."""
        n, k = chosen.shape
        out = self.cp.empty((n, stack.rows), dtype=self.cp.float16)
        self.launch("moe_down", stack, (n,), (chosen, np.int32(k), x, weights, out), block_rows=self.warp_rows)
        return out

    def operand(self, stack: ExpertStack, x: Row8):
        """What a stack's matvec reads of x: fp16 values, or the 8-bit units."""
        if stack.kind == "F16":
            return x.values
        return x.q8 if x.q8 is not None else self.kernels.quantize_q8(x.values.reshape(-1))

    def launch(self, family: str, stack: ExpertStack, grid: tuple, args: tuple, *tables, block_rows: int = 0) -> None:
        """A decode kernel over a stack's rows, block_rows a block (a matvec block's by default), then
        the grid's other dimensions: (its table, *tables, rows, cols, *args)."""
        blocks = math.ceil(stack.rows / (block_rows or self.matvec_rows))
        self.fn[f"{family}_{stack.kind}"]((blocks, *grid), (self.matvec_threads,),
                                          (self.table(stack), *tables, np.int32(stack.rows), np.int32(stack.cols),
                                           *args))

    def prompt(self, h, experts: Experts, chosen, weights):
        """A chunk h (n, dim) fp16: its n*k (token, choice) entries grouped by expert on the device,
        each expert's entries through its gate/up and down matrices as tiled tensor-core GEMMs (one
        launch per stacked tensor for all experts), then each token's k outputs summed with their
        weights. -> (n, dim) fp16."""
        cp = self.cp
        n, dim = h.shape
        k, ffn, count = chosen.shape[1], experts.gate.rows, experts.gate.experts
        entries = n * k
        offsets, tiles = cp.empty(count + 1, dtype=cp.int32), cp.empty(count + 1, dtype=cp.int32)
        order, inv = cp.empty(entries, dtype=cp.int32), cp.empty(entries, dtype=cp.int32)
        self.fn["moe_sort"]((1,), (1024,), (chosen, np.int32(entries), np.int32(count), offsets, tiles, order, inv))
        groups = (order, offsets, tiles, np.int32(count))
        row_tiles = math.ceil(entries / GEMM_BM) + count  # at most: each expert's last tile part full
        gate_up = cp.empty((entries, 2 * ffn), dtype=cp.float16)  # rows in grouped order
        for stack, out in ((experts.gate, gate_up), (experts.up, gate_up[:, ffn:])):
            self.gemm(stack, h, k, groups, out, 2 * ffn, row_tiles)
        act = self.kernels.silu_mul(gate_up)  # (entries, ffn)
        y = cp.empty((entries, dim), dtype=cp.float16)
        self.gemm(experts.down, act, 0, groups, y, dim, row_tiles)
        out = cp.empty((n, dim), dtype=cp.float16)
        octets = n * dim // 8
        self.fn["moe_combine"]((math.ceil(octets / 256),), (256,), (y, inv, weights, out, np.int32(n), np.int32(k),
                                                                   np.int32(dim)))
        return out

    def gemm(self, stack: ExpertStack, x, gather: int, groups, out, out_stride: int, row_tiles: int):
        """out[p] = x's row for entry p (x[order[p] // gather], or x[p] when gather is 0) . W_e^T."""
        order, offsets, tiles, count = groups
        self.fn[f"moe_gemm_{stack.kind}"](
            (row_tiles, math.ceil(stack.rows / GEMM_BN)), (GEMM_THREADS,),
            (x, np.int32(x.shape[1]), np.int32(gather), order, offsets, tiles, count, self.table(stack),
             np.int32(stack.rows), np.int32(stack.cols), out, np.int32(out_stride)))
