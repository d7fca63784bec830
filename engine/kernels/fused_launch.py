"""Launchers of quant.cu's fused decode kernels: one decode row's matvec with the small kernel that follows it in
its epilogue, so that a lone request's step (bound by its launches' latency) has fewer of them. matvec_act_<T>:
gate and up with SwiGLU after them; matvec_norm_<T>: an output projection with the residual add and the next
RMSNorm after it. Each gives the bits of the launches it replaces (tools/checks/fused_kernels.py), and says
None where it does not apply (the caller then launches those), and unless asked for ($STRATA_FUSED_MATVEC=1):
on the H200 they made a lone decode row slower (the 8B Q4_K_M shape 382 -> 309 tok/s, the 135M 1,567 -> 1,409;
matvec_norm_Q6_K at 1.5 TB/s, matvec_act_Q4_K at 2.2: bench/HISTORY.md), so the separate launches stay the
default until the kernels measure faster."""
from __future__ import annotations

from types import ModuleType

import numpy as np

from engine.core.quantized import BLOCKS, UNIT, QuantMatrix, Row8
from engine.kernels.args import q8_units
from engine.kernels.limits import MATVEC_THREADS, blocks
from engine.kernels.matvec_launch import MATVEC_SOLO_ROWS

MATVEC_ACT_COLS = 2  # quant.cu's MV_ACT_COLS: columns of act (a gate row and an up row each) a warp of matvec_act


def gate_up_halves(w) -> tuple[str, object, object, int] | None:
    """(kind, the gate's rows, the up's rows, ffn) of a quantized gate_up (2 ffn, k) whose halves are blocks of
    one kind (one part, or two of ffn rows each), else None."""
    if not isinstance(w, QuantMatrix) or w.shape[0] % (2 * UNIT):
        return None
    ffn = w.shape[0] // 2
    kinds = {p.kind for p in w.parts}
    if len(kinds) != 1 or not kinds <= BLOCKS.keys():
        return None
    if len(w.parts) == 1:
        data = w.parts[0].data
        return w.parts[0].kind, data[:ffn], data[ffn:], ffn
    if len(w.parts) == 2 and w.parts[0].rows == ffn:
        return w.parts[0].kind, w.parts[0].data, w.parts[1].data, ffn
    return None


class FusedLaunchers:
    """Mixed into GpuKernels, which sets what these read: cp (CuPy), fn (kernel name -> function), norm_counter
    (matvec_norm's block counter: one int32, zero at rest, at a fixed address for the decode graphs), and
    stage_bytes (MatvecLaunchers')."""

    cp: ModuleType
    fn: dict
    norm_counter: object
    fused_matvec = False  # launch matvec_act / matvec_norm at all (GpuKernels: $STRATA_FUSED_MATVEC=1)

    def matvec_act(self, w, x: Row8) -> Row8 | None:
        """silu(gate) * up of one decode row x (1, k) against a stacked gate_up w (2 ffn, k) -> (1, ffn) fp16 with
        its Q8 units, in one launch; None unless w's halves are quantized blocks of one kind."""
        if not self.fused_matvec or len(x.values) != 1:
            return None
        halves = gate_up_halves(w)
        if halves is None:
            return None
        kind, gate, up, ffn = halves
        out = self.cp.empty((1, ffn), dtype=self.cp.float16)
        units = q8_units(self.cp, ffn)
        self.fn[f"matvec_act_{kind}"]((ffn // UNIT,), (32 // MATVEC_ACT_COLS * 32,),
                                      (gate, up, x.q8, out, units, np.int32(w.shape[1])))
        return Row8(out, units)

    def matvec_norm(self, w, a: Row8, x, weight, eps: float) -> Row8 | None:
        """x (1, m) fp32 += a @ w^T for one decode row a (1, k) and a quantized w (m, k) of one kind, then
        rms_norm(x) * weight (m,) fp32 as add_rms_norm returns it (a Row8), in one launch; None where it does
        not apply (w fp16 or in parts, m not a whole number of a block's rows)."""
        if not self.fused_matvec or not isinstance(w, QuantMatrix) or len(w.parts) != 1 or len(a.values) != 1:
            return None
        (part,), (m, k) = w.parts, w.shape
        if part.kind not in BLOCKS or m % MATVEC_SOLO_ROWS or m % UNIT:
            return None
        delta, out = (self.cp.empty((1, m), dtype=self.cp.float16) for _ in range(2))
        units = q8_units(self.cp, m)
        stage = self.stage_bytes(part.kind, part.data, m, k, 1)
        self.fn[f"matvec_norm_{part.kind}"](blocks(m, MATVEC_SOLO_ROWS), (MATVEC_THREADS,),
                                            (part.data, a.q8, delta, np.int32(m), np.int32(k), np.int32(stage), x,
                                             weight, out, units, np.float32(eps), self.norm_counter),
                                            shared_mem=stage * (MATVEC_THREADS // 32))
        return Row8(out, units)
