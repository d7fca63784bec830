"""Launchers of linear_attention.cu: a hybrid model's Gated DeltaNet mixer over a step's rows and recurrent
states, the gated attention's sigmoid gate (engine/ops/hybrid_ops.py)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from types import ModuleType

import numpy as np

from engine.core.chunks import DELTA_CHUNK as CHUNK
from engine.core.quantized import UNIT, Row8
from engine.core.step import Step
from engine.kernels.args import NULL, address, q8_units

LA_THREADS = 128  # linear_attention.cu's row-wise blocks
CHUNK_THREADS = 256  # a delta_prep or delta_chunks block
TILE = 32  # state columns a delta_chunks block holds
CONV_KERNELS = (4,)  # conv_rows_k<K>, conv_window_k<K> built
SCAN_WIDTHS = (32, 64, 128)  # delta_prep_d<D>, delta_chunks_d<D> built, for dk = dv = D


def state_addresses(states) -> np.ndarray:
    """SequenceStates' arrays by address: (4, seqs) uint64, rows now.conv, now.ssm, mark.conv, mark.ssm."""
    return np.array([[address(s.now.conv) for s in states], [address(s.now.ssm) for s in states],
                     [address(s.mark.conv) for s in states], [address(s.mark.ssm) for s in states]], dtype=np.uint64)


@dataclass(frozen=True)
class Chunks:
    """A prompt step's chunks of the chunked form, each sequence's in order (its read starts at a multiple of CHUNK,
    its mark): chunk c is step rows [lo[c], lo[c] + rows[c]), rows[c] <= CHUNK (short: the read's last)."""

    count: int
    lo: object  # (count,) int32 on the device
    rows: object  # (count,) int32 on the device
    of_sequence: object  # (seqs + 1,) int32 on the device: sequence s's chunks are [of_sequence[s], of_sequence[s + 1])

    @staticmethod
    def layout(counts: list[int]) -> np.ndarray:
        """Each sequence's row count, in step order -> [lo | rows | of_sequence] int32 (chunks, chunks, seqs + 1)."""
        lo, rows, first = [], [], [0]
        at = 0
        for n in counts:
            for c in range(0, n, CHUNK):
                lo.append(at + c)
                rows.append(min(CHUNK, n - c))
            first.append(len(lo))
            at += n
        return np.array(lo + rows + first, dtype=np.int32)

    @classmethod
    def within(cls, laid_out, seqs: int) -> Chunks:
        """The chunks of `layout`'s array (on the device) for `seqs` sequences."""
        n = (len(laid_out) - seqs - 1) // 2
        return cls(n, laid_out[:n], laid_out[n: 2 * n], laid_out[2 * n:])


@dataclass(frozen=True)
class StatePointers:
    """A step's recurrent states as the kernels read them, made once a forward (every linear-attention layer
    reads them): per sequence of the step, in row order, the addresses of its `now` and `mark` states'
    convolution windows and delta-rule matrices, its rows and where its read leaves its mark; a prompt step's
    chunks (None: a decode step's rows, one a sequence)."""

    seqs: int
    addresses: object  # (4, seqs) uint64 on the device: now.conv, now.ssm, mark.conv, mark.ssm
    row_lo: object  # (seqs + 1,) int32 on the device: sequence s's rows are [row_lo[s], row_lo[s + 1])
    mark_after: object  # (seqs,) int32 on the device: its rows after which its state is its mark too (0: none)
    chunks: Chunks | None = None


class LinearAttentionLaunchers:
    """Mixed into GpuKernels, which sets what these read: cp (CuPy), fn (kernel name -> function)."""

    cp: ModuleType
    fn: dict

    def state_pointers(self, step: Step, states: tuple) -> StatePointers:
        """step's sequences' SequenceStates (engine/kvcache/recurrent.py, on the device) for the kernels.
        Decode rows: one sequence a row, no mark; prompt rows: each read's rows from its mark, which moves to
        the read's last chunk boundary (SequenceState.next_mark)."""
        if step.states is not None:  # a decode graph's, set before its replay
            return step.states
        if step.batch or step.decode:
            counts, marks, layout = [1] * len(states), [0] * len(states), np.zeros(0, np.int32)
        else:
            spans = step.spans_or_one()
            counts = [n for _, n in spans]
            marks = [state.next_mark(start, n) - start for (start, n), state in zip(spans, states)]
            layout = Chunks.layout(counts)
        seqs = len(states)
        rows = self.cp.asarray(np.concatenate([[0], np.cumsum(counts), marks, layout]).astype(np.int32))
        chunks = Chunks.within(rows[2 * seqs + 1:], seqs) if len(layout) else None
        return StatePointers(seqs, self.cp.asarray(state_addresses(states)), rows[: seqs + 1],
                             rows[seqs + 1: 2 * seqs + 1], chunks)

    def state_slots(self, rows: int) -> StatePointers:
        """A decode graph's StatePointers for `rows` rows (a sequence each, no mark), at fixed addresses that
        set_states fills before each replay."""
        lo = self.cp.asarray(np.concatenate([np.arange(rows + 1), np.zeros(rows)]).astype(np.int32))
        return StatePointers(rows, self.cp.zeros((4, rows), dtype=self.cp.uint64), lo[: rows + 1], lo[rows + 1:])

    def set_states(self, pointers: StatePointers, states) -> None:
        """A decode graph's rows' states (one SequenceState a row) into its StatePointers, on the current stream."""
        pointers.addresses.set(state_addresses(states))

    def delta_net(self, proj, lw, hy, j: int, rows: StatePointers, eps: float, q8: bool = False):
        """proj (n, channels + nv*dv + 2*nv) fp16, a Gated DeltaNet layer's in-projection over the step's rows
        -> (n, nv*dv) fp16, the out-projection's input (a Row8 with q8: its 8-bit form too); state layer j of
        each sequence advanced (and its mark where its read reaches one). The convolution, q/k norms and delta
        rule in float32; a decode step's in two kernels (the recurrent form), a prompt step's in six (the chunked
        form: linear_attention.cu)."""
        cp, fn = self.cp, self.fn
        if hy.conv_kernel not in CONV_KERNELS or hy.dk != hy.dv or hy.dk not in SCAN_WIDTHS:
            raise ValueError(f"no delta-rule kernel for a convolution of {hy.conv_kernel} and heads of dk {hy.dk}, "
                             f"dv {hy.dv} (built: kernels {CONV_KERNELS}, dk = dv in {SCAN_WIDTHS})")
        n, stride = proj.shape
        channels, nv, kh, d, k = hy.channels, hy.v_heads, hy.k_heads, hy.dk, hy.conv_kernel
        now_conv, now_ssm, mark_conv, mark_ssm = rows.addresses
        seqs = (rows.row_lo, rows.mark_after)
        conv_at, ssm_at = np.int64(j * (k - 1) * channels), np.int64(j * nv * d * d)
        z_col, b_col, a_col = channels, channels + nv * d, channels + nv * d + nv
        conv = cp.empty((n, channels), dtype=cp.float32)
        out = cp.empty((n, nv * d), dtype=cp.float16)
        units = q8_units(cp, n * nv * d, q8)
        norms = (np.int32(kh), np.float32(d ** -0.5), np.float32(hy.l2_eps))
        gates = (lw.a, lw.dt_bias)
        heads = (np.int32(nv), np.int32(kh), np.int32(hy.tiled), np.int32(channels))
        if rows.chunks is None:  # a decode step, a row a sequence: the convolution with the q/k norms, the delta
            # rule (recurrent) with the gated norm
            fn[f"conv_l2_k{k}_d{d}"]((channels // d, rows.seqs), (d,), (proj, np.int32(stride), conv, lw.conv, now_conv,
                                                                       mark_conv, *seqs, np.int32(channels), conv_at,
                                                                       *norms))
            fn[f"delta_norm_k{d}"]((nv, rows.seqs), (d,), (conv, proj, np.int32(stride), np.int32(z_col), np.int32(b_col),
                                                          np.int32(a_col), *gates, lw.norm, out,
                                                          units if q8 else NULL, now_ssm, mark_ssm, *seqs, *heads,
                                                          ssm_at, np.float32(eps)))
        else:  # a prompt step: every row's convolution, the windows moved on, the norms, the chunked form
            chunks = rows.chunks
            fn[f"conv_rows_k{k}"]((n, math.ceil(channels / LA_THREADS)), (LA_THREADS,),
                                  (proj, np.int32(stride), conv, lw.conv, now_conv, rows.row_lo, np.int32(channels),
                                   conv_at))
            fn[f"conv_window_k{k}"]((math.ceil(channels / LA_THREADS), rows.seqs), (LA_THREADS,),
                                    (proj, np.int32(stride), now_conv, mark_conv, *seqs, np.int32(channels), conv_at))
            fn[f"l2_heads_d{d}"]((n * 2 * kh,), (d,), (conv, np.int32(channels), np.int32(2 * kh), *norms))
            values = cp.empty((chunks.count, nv, CHUNK, d), dtype=cp.float32)
            keys = cp.empty((chunks.count, nv, CHUNK, d), dtype=cp.float32)
            inner = cp.empty((chunks.count, nv, CHUNK, CHUNK), dtype=cp.float32)
            decays = cp.empty((chunks.count, nv, CHUNK), dtype=cp.float32)
            fn[f"delta_prep_d{d}"]((chunks.count, nv), (CHUNK_THREADS,),
                                   (conv, proj, np.int32(stride), np.int32(b_col), np.int32(a_col), *gates, chunks.lo,
                                    chunks.rows, values, keys, inner, decays, *heads))
            o = cp.empty((n, nv, d), dtype=cp.float32)
            fn[f"delta_chunks_d{d}"]((d // TILE, nv, rows.seqs), (CHUNK_THREADS,),
                                     (conv, values, keys, inner, decays, chunks.lo, chunks.rows, chunks.of_sequence,
                                      now_ssm, mark_ssm, rows.mark_after, o, *heads, ssm_at))
            fn[f"gated_norm_d{d}"]((n * nv,), (d,), (o, proj, np.int32(stride), np.int32(z_col), lw.norm, out,
                                                     units if q8 else NULL, np.int32(nv), np.float32(eps)))
        return Row8(out, units) if q8 else out

    def sigmoid_mul(self, x, gate, q8: bool = False):
        """x * sigmoid(gate): (n, width) fp16 both (width % 32 == 0) -> fp16 (a Row8 with q8: its 8-bit form too)."""
        out = self.cp.empty(x.shape, dtype=self.cp.float16)
        units = q8_units(self.cp, x.size, q8)
        self.fn["sigmoid_mul"]((math.ceil(x.size // UNIT / LA_THREADS),), (LA_THREADS,),
                               (x, gate, out, units if q8 else NULL, np.int64(x.size // UNIT)))
        return Row8(out, units) if q8 else out
