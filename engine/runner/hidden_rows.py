"""The rows of a prompt step whose normed hidden states requests read besides the logits (the final
norm's output, LlamaModel.final_logits' hidden_rows): an embed request's pooling
(engine/runner/pooling.py SequencePool) and prompt log-probabilities (engine/runner/prompt_scores.py
PromptScorer). Each such reader says which rows of a read it wants and takes them."""
from __future__ import annotations

from engine.runner.sequence import Sequence


def readers(seq: Sequence) -> list:
    """The sequence's readers of hidden rows: its pool (an embed request), its prompt scorer."""
    return [r for r in (seq.pool, seq.scorer) if r is not None]


def hidden_rows(pieces: list[tuple[Sequence, int]]) -> list[int] | None:
    """The rows of a prompt step over `pieces` (the reads' rows one after another) whose normed hidden
    states the readers among them want; None if none does."""
    rows, offset = [], 0
    for seq, end in pieces:
        for reader in readers(seq):
            rows += [offset + r for r in reader.wanted(seq.pos, end)]
        offset += end - seq.pos
    return rows or None


def take_hidden(pieces: list[tuple[Sequence, int]], rows: list[int] | None, out):
    """The step's output (the forward's: logits, or (logits, hidden) with `rows`) parted: each reader
    given its rows (before the sequence's position moves to the piece's end); returns the logits."""
    if rows is None:
        return out
    logits, hidden = out  # hidden: (len(rows), dim) float32
    at = 0
    for seq, end in pieces:
        for reader in readers(seq):
            n = len(reader.wanted(seq.pos, end))
            if n:
                reader.add(hidden[at : at + n], seq.pos, end)
                at += n
    return logits
