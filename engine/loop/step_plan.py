"""Which reads a prompt step takes, and how many rows of each (engine/loop/rounds.py runs the step).

Where the kernels' rows do not depend on the step's shape (runner.shape_free), the reads in line share a step: the
first takes up to a chunk, the ones behind it fill what is left of `step_tokens`, each ending anywhere (a burst of
short reads in as few steps as that allows: a chunk's rows a step instead cost 64 clients' burst a quarter more
time, their decode steps coming as often between smaller steps, for no gain in sixteen sub-agents' first tokens,
bench/HISTORY.md, seventeenth session); where reads behind a long one end theirs within a chunk, they go first, in
a step of their own (every other step at most). Elsewhere one read a step, its next chunk at absolute boundaries
(engine/core/chunks.py).

Answers read again for the prefix cache (engine/loop/admission.py settles) come last and take at most SETTLE_ROWS of
a step, whether they fill a request's step or make one of their own: a request that arrives while they are read waits
for a step of that many rows at most, and a request's step is never doubled by them (a burst of new clients met a
4,096-row step of the last run's answers, ~100 ms on the 8B shape, and an agent's 2,048-row chunk took 99 ms instead
of 51 with 2,048 rows of answers beside it: bench/HISTORY.md, twenty-first session).
"""
from __future__ import annotations

from typing import Callable

from engine.core.chunks import chunk_end
from engine.loop.memory import Memory
from engine.loop.request_table import RequestTable
from engine.loop.step_limits import StepLimits
from engine.runner.sequence import Sequence

SETTLE_ROWS = 512  # the most rows of answers read again in one step (~15 ms of the 8B shape's on an H100)


class StepPlan:
    def __init__(self, runner, requests: RequestTable, memory: Memory, limits: StepLimits, step_tokens: int,
                 short_of_blocks: Callable[[Sequence], None]):
        """short_of_blocks(read): the first read in line could not have the blocks of its next rows."""
        self.runner, self.requests, self.memory, self.limits = runner, requests, memory, limits
        self.step_tokens, self.short_of_blocks = step_tokens, short_of_blocks
        self.held_last = False  # whether the latest step held the first read in line back (held_back)
        self.settle_rows = SETTLE_ROWS

    def pieces(self) -> list[tuple[Sequence, int]]:
        """The next prompt step: (read, the position its rows end at) for the first read in line and,
        when rows may share a step, the reads behind it while step_tokens allows, each with its
        blocks had first. Empty if nobody reads (or the first read could not have its blocks)."""
        readers = self.requests.readers()
        if not readers:
            return []
        held = self.held_back(readers)
        first = next(seq for seq in readers if seq not in held)
        budget = self.step_rows(first)
        settle_left = max(self.settle_rows, self.runner.read_align)  # (rows of answers read again this step may
        # still take; a hybrid's read ends only at its delta rule's chunks, or its end)
        end = self.piece_end(first, min(budget, settle_left) if first.settling else budget)
        if not self.memory.get_blocks(first, end):
            self.short_of_blocks(first)
            return []
        pieces, keys = [(first, end)], end
        self.requests.in_step = [first]  # the reads chosen: the blocks had for the next ones never come from them
        left = budget - (end - first.pos)
        settle_left -= (end - first.pos) if first.settling else 0
        for seq in self.requests.readers() if self.runner.shape_free else ():  # (as the first's blocks left them:
            # room for it may have paused a newer read, or dropped an answer read again)
            if seq is first or seq in held:
                continue
            if left <= 0:
                break
            if seq not in self.requests.line or seq.paused:
                continue  # let go by a companion's blocks (an answer read again) in this loop
            end = self.piece_end(seq, min(left, settle_left) if seq.settling else left)
            if end <= seq.pos:
                continue  # too few rows left in the step for this read's next piece
            if self.runner.step_keys is not None and keys + end > self.runner.step_keys:
                break  # the step's keys would not fit the scratch its attention widens them into
            if not self.memory.get_blocks(seq, end, pause_others=False):
                break  # a read behind the first waits for room rather than take it from others
            pieces.append((seq, end))
            self.requests.in_step.append(seq)
            keys += end
            left -= end - seq.pos
            settle_left -= (end - seq.pos) if seq.settling else 0
        self.requests.in_step = []
        return pieces

    def step_rows(self, first: Sequence) -> int:
        """The rows the next prompt step may take, first its first read: step_tokens, and while others decode, as
        many as keep its time within step_ms by first's latest step (where rows may share a step and so end
        anywhere; a read's first step has no such estimate: other steps' time a row says little of its own)."""
        if not (self.runner.shape_free and self.requests.any_decoding()):
            return self.step_tokens
        return self.limits.capped_rows(self.step_tokens, first.row_ms)

    def held_back(self, readers: list[Sequence]) -> list[Sequence]:
        """The reads whose chunks wait a step: where rows may share a step and the first read in line will
        not end its read in this one while reads behind it end theirs within a chunk (a short newcomer
        beside a long read), every read that will not end in this step, so that the short ones get a step
        of their own: a newcomer's first token comes after the step in progress and its own short one, not
        after a long chunk too. Every other step at most: a long read never waits two steps in a row. Never for an
        answer read again (no request waits for it: an agent's long read was held a step for them)."""
        chunk = self.runner.chunk
        requests = [seq for seq in readers if not seq.settling]
        long = [seq for seq in requests if seq.total - seq.pos > chunk]
        hold = (self.runner.shape_free and not self.held_last and bool(long) and long[0] is readers[0]
                and len(long) < len(requests))
        self.held_last = hold
        return long if hold else []

    def piece_end(self, seq: Sequence, left: int) -> int:
        """Where seq's rows in the next step end: up to a chunk (of `left` rows at most) when rows may
        share a step, else its next absolute chunk."""
        chunk = self.runner.chunk
        if self.runner.shape_free:
            end = min(seq.total, seq.pos + min(chunk, left))
            if end < seq.total:  # a read ends where the runner's reads may (a hybrid's: the delta rule's
                end = max(seq.pos, end // self.runner.read_align * self.runner.read_align)  # chunks), or at its end
            return end
        return chunk_end(seq.pos, seq.total, chunk)
