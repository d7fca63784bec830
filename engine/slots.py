"""The engine's slots: each request in the engine has its KV rows in one. A slot whose request has
ended keeps the conversation it read, so that the next turn of that conversation (agents send the
whole history again each turn) reads only what is new.

What a slot keeps is the prompt's whole chunks: their rows were written by prompt-chunk reads at
absolute boundaries, so a later prompt that starts with the same tokens finds there exactly the
rows a cold read of its first chunks would write (a decode step's rows, or a partial chunk's, come
from other shapes and are never reused). Reuse is therefore rounded down to a chunk boundary and is
bit-identical to reading from position 0.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from engine.sequence import Sequence


@dataclass
class Slot:
    index: int
    seq: Sequence | None = None  # the request whose rows it holds: reading, decoding or parked in place
    kept: tuple[int, ...] = ()  # while free: the tokens whose rows are still valid (whole chunks)
    used: int = 0  # when it was last given up (a counter): the least recently used free slot goes first


def common_prefix(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    n = min(len(a), len(b))
    if n == 0:
        return 0
    diff = np.flatnonzero(np.asarray(a[:n], dtype=np.int64) != np.asarray(b[:n], dtype=np.int64))
    return int(diff[0]) if diff.size else n


class SlotTable:
    def __init__(self, count: int, chunk: int):
        if count < 1:
            raise ValueError("--slots must be >= 1")
        self.slots = [Slot(i) for i in range(count)]
        self.chunk = chunk
        self.ticks = itertools.count(1)

    def __len__(self) -> int:
        return len(self.slots)

    def free(self) -> list[Slot]:
        return [s for s in self.slots if s.seq is None]

    def reusable(self, slot: Slot, prompt: tuple[int, ...]) -> int:
        """Prompt tokens whose rows `slot` already holds: the common prefix with what it kept, rounded
        down to a chunk boundary, and short of the prompt's last token (whose logits are wanted)."""
        if not slot.kept:
            return 0
        limit = (len(prompt) - 1) // self.chunk * self.chunk
        return min(common_prefix(slot.kept, prompt) // self.chunk * self.chunk, limit)

    def place(self, seq: Sequence, reuse: bool = True) -> bool:
        """Put `seq` in a free slot: the one whose kept conversation saves the most reading, else the
        least recently used (the oldest conversation gives way). Sets seq.slot, and with a reuse
        seq.pos = seq.cached = the tokens not read again. False if no slot is free."""
        free = self.free()
        if not free:
            return False
        gains = [self.reusable(s, seq.prompt) if reuse else 0 for s in free]
        best = max(range(len(free)), key=lambda i: (gains[i], -free[i].used))
        slot = free[best]
        slot.seq, slot.kept = seq, ()
        seq.slot = slot.index
        if gains[best]:
            seq.pos = seq.cached = gains[best]
        return True

    def release(self, seq: Sequence, keep: bool) -> None:
        """`seq` leaves its slot; with keep, the slot keeps the whole chunks of its prompt read so far."""
        if seq.slot is None:
            return
        slot = self.slots[seq.slot]
        slot.seq, slot.used = None, next(self.ticks)
        slot.kept = tuple(seq.prompt[: seq.pos // self.chunk * self.chunk]) if keep else ()
        seq.slot = None

    def status(self) -> list[dict]:
        return [{"slot": s.index, "id": None if s.seq is None else s.seq.id, "kept": len(s.kept)} for s in self.slots]
