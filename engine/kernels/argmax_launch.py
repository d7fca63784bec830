"""Launcher of argmax.cu: each row's first index of its maximum (the greedy pick), a batch's temperature
draws (engine/runner/batch_draws.py) and its rows' log-probabilities (engine/runner/logprob_rows.py), on the
device."""
from __future__ import annotations

from types import ModuleType

import numpy as np

PICK_PARAMS = 5  # a row's draw parameters (argmax.cu's pick_keys, pick_draw): temperature, top_k, top_p, min_p, u
KEY_THREADS, DRAW_THREADS, LOGZ_THREADS, TOP_THREADS = 256, 1024, 256, 1024  # argmax.cu's
TOP_MAX = 256  # argmax.cu's: the largest top_k pick_top finds without sorting every key


def index_bits(vocab: int) -> int:
    """The bits of a vocabulary index in a draw's sort keys."""
    return max(1, (vocab - 1).bit_length())


class ArgmaxLauncher:
    """Mixed into GpuKernels, which sets what it reads: cp (CuPy), fn (kernel name -> function)."""

    cp: ModuleType
    fn: dict

    def argmax(self, logits):
        """logits: (rows, n) fp32 -> (rows,) int64 on the device: each row's first index of its
        maximum (numpy.argmax)."""
        logits = logits.reshape(-1, logits.shape[-1])
        out = self.cp.empty(logits.shape[0], dtype=self.cp.int64)
        self.fn["argmax_first"]((logits.shape[0],), (1024,), (logits, out, np.int32(logits.shape[1])))
        return out

    def pick_rows(self, logits, params, out, top: bool = False) -> None:
        """Each row's temperature draw: logits (rows, n) fp32, params (rows, PICK_PARAMS) fp64 (temperature >
        0, top_k (0: off), top_p, min_p, u) -> out (rows,) int64, on the current stream (pick_keys, the order of
        the candidates, pick_draw; the scratch, 12 bytes a logit, from the current allocator). The order: one
        radix sort of every row's keys, or with top (the caller's word that every row has 0 < top_k <= TOP_MAX)
        each row's top_k smallest keys found by pick_top, the same keys in the same order (a vocabulary of up to 2^24
        tokens; past that, the sort)."""
        rows, n = logits.shape
        bits = index_bits(n)
        if 32 + bits + max(1, (rows - 1).bit_length()) > 64:
            raise ValueError(f"{rows} rows of {n} logits do not fit a draw's 64-bit sort keys")
        scaled = self.cp.empty((rows, n), dtype=self.cp.float32)
        keys = self.cp.empty(rows * n, dtype=self.cp.uint64)
        self.fn["pick_keys"]((-(-n // KEY_THREADS), rows), (KEY_THREADS,),
                             (logits, params, scaled, keys, np.int32(n), np.int32(bits)))
        if top and 32 + bits <= 56:  # (pick_top's rounds shift a key's bits below its row's by up to their width + 8)
            order = self.cp.empty(rows * TOP_MAX, dtype=self.cp.uint64)
            self.fn["pick_top"]((rows,), (TOP_THREADS,), (keys, params, order, np.int32(n), np.int32(bits)))
            stride = TOP_MAX
        else:
            keys.sort()  # (a radix sort: the keys are unique, so their order is the only one)
            order, stride = keys, n
        self.fn["pick_draw"]((rows,), (DRAW_THREADS,), (scaled, order, params, out, np.int32(n), np.int32(bits),
                                                        np.int32(stride)))

    def row_logprobs(self, logits, tokens):
        """logits (rows, n) fp32, tokens (rows,) int64 -> (rows, 2) fp64 on the device: each row's log-partition
        (fp64 sums in a fixed order, a block a row: a row's figures are its own alone) and its token's
        log-probability."""
        rows, n = logits.shape
        out = self.cp.empty((rows, 2), dtype=self.cp.float64)
        self.fn["row_logprobs"]((rows,), (LOGZ_THREADS,), (logits, tokens, out, np.int32(n)))
        return out
