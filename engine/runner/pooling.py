"""Embeddings (GEN embed=1): a request whose prompt is read like any other's (in chunks that share steps
with other reads and decodes, and park), whose answer is its pooled hidden state instead of tokens:
an EMB line, then DONE with no token (engine/loop/decode_steps.py). The hidden state is the final
norm's output, the rows the head reads (LlamaModel.final_logits), pooled as the model's file says
(<arch>.pooling_type, llama.cpp's enum) or as the engine's --pooling overrides:

- last: the prompt's last row (Qwen3-Embedding's files say so); a cached prefix may be reused, the last
  row being read whatever;
- cls: its first row; mean: the mean of all its rows. Every row from position 0 must be computed, so such
  a request reuses no prefix (engine/loop/admission.py).

Exactness: a row's normed hidden state is the same in any step (docs/DESIGN.md), and `mean` sums the rows
in absolute blocks of BLOCK positions, each block in one sum of its own (the rows of a block that a
step's end cuts are held until the rest of it is read) and the blocks' sums in order: the vector is a
function of the prompt alone, whatever the steps, the parks or the requests beside it.
"""
from __future__ import annotations

import numpy as np

from engine.modelfile.model_config import POOLINGS

BLOCK = 64  # positions whose rows `mean` sums together


def embed_refusal(runner) -> str | None:
    """Why this engine cannot answer an embed request, or None."""
    pooling = getattr(runner, "pooling", "unset")  # (the mock engine's runner has none)
    if getattr(runner, "recurrent", None) is not None:
        return ("embeddings are not available for hybrid models (a read starts again at its recurrent state's "
                "mark, reading rows twice)")
    if pooling == "unset":
        return ("this model's file names no pooling (<arch>.pooling_type): start the engine with "
                "--pooling mean|cls|last to serve embeddings")
    if pooling not in POOLINGS:
        return (f"this model's file says pooling {pooling!r}, which embeddings do not take (mean, cls or last): "
                "start the engine with --pooling mean|cls|last to serve them")
    return None


class SequencePool:
    """One embed request's pooled hidden state, built as its prompt is read."""

    def __init__(self, kind: str, total: int, xp):
        self.kind, self.total, self.xp = kind, total, xp
        self.sum = None  # (dim,) float32: the blocks summed so far, in order (mean)
        self.held = None  # (k, dim) float32: the rows of the block a step's end cut, k < BLOCK (mean)
        self.vector = None  # (dim,) float32 on the device, once the prompt is read

    @property
    def reuses(self) -> bool:
        """Whether a cached prefix may be reused: only `last`, whose row is read whatever."""
        return self.kind == "last"

    def wanted(self, start: int, end: int) -> list[int]:
        """Of a read's rows [start, end) (as offsets from start), the ones whose hidden states it needs."""
        if self.kind == "mean":
            return list(range(end - start))
        if self.kind == "cls":
            return [0] if start == 0 else []
        return [end - start - 1] if end == self.total else []

    def add(self, hidden, start: int, end: int) -> None:
        """hidden: (len(wanted(start, end)), dim) float32, the rows wanted of the read [start, end)."""
        if self.kind != "mean":
            self.vector = hidden[0]  # (dim,)
            return
        xp = self.xp
        first = start - (0 if self.held is None else len(self.held))  # rows[0]'s position: a block's start
        rows = hidden if self.held is None else xp.concatenate([self.held, hidden])  # (end - first, dim)
        cut = end if end == self.total else max(first, end // BLOCK * BLOCK)  # the rows before it are summed
        for lo in range(first, cut, BLOCK):
            part = xp.sum(rows[lo - first : min(lo + BLOCK, cut) - first], axis=0)  # (dim,) one block's rows
            self.sum = part if self.sum is None else self.sum + part
        self.held = rows[cut - first :].copy() if cut < end else None
        if end == self.total:
            self.vector = self.sum / np.float32(self.total)  # (dim,)
