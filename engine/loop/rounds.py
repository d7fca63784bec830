"""What one round runs: a decode step for every decoding request, then prompt steps, and the
tokens drawn and written out.

A round is one decode step for every decoding request together (one pass over the weights), then
prompt steps while the decoders have waited less than `interval_ms` (at least one step), so that a
long read never stops the others from decoding and reads get the time the interval allows. What a
prompt step reads depends on the runner (engine/runner/runner.py, shape_free):
- with kernels whose rows do not depend on the step's shape, the reads in line share the step: the
  first one reads up to a chunk, the ones behind it fill what is left of `step_tokens` (where the first
  ends its read in the step, the reads that end theirs take a chunk's rows in all: a burst of short reads
  goes a few a step), each ending anywhere; when reads behind a long one end theirs within a chunk, they go first, in a step of their
  own (every other step at most): a short newcomer's read waits for neither a park nor a long chunk;
- else one read a step, its next chunk at absolute boundaries (engine/core/chunks.py).
A request's first token is drawn right after its prompt's last row (an embed request's vector is written
then, and its DONE: engine/runner/pooling.py). A step deep in a long read takes longer than a decoding
client should wait for its next token, so it pauses between layers for further decode steps, about
every `interval_ms` (engine/loop/read_pauses.py); the pauses change neither the step's arithmetic nor
its rows. While others decode, a step takes no more rows than its estimated time allows (step_ms,
engine/loop/step_limits.py): a request that arrives meanwhile waits for the step in progress. Control
lines are taken after the decode step and after each prompt step, before its PPs.
"""
from __future__ import annotations

import time
from typing import Callable

from protocol import messages as m

from engine.loop.admission import Admission
from engine.loop.decode_steps import DecodeSteps
from engine.loop.memory import Memory
from engine.core.chunks import chunk_end, step_budget
from engine.loop.parking import Parking
from engine.loop.protocol_io import Inbox
from engine.loop.read_pauses import ReadPauses
from engine.loop.request_table import RequestTable
from engine.loop.step_limits import StepLimits
from engine.loop.step_trace import StepTrace
from engine.runner.sequence import Sequence


class Rounds:
    def __init__(self, runner, requests: RequestTable, memory: Memory, parking: Parking, admission: Admission,
                 write: Callable[[m.Message], None], inbox: Inbox, control: Callable[[m.Message], None],
                 limits: StepLimits = StepLimits()):
        self.runner, self.requests, self.memory, self.parking = runner, requests, memory, parking
        self.admission, self.write, self.limits = admission, write, limits
        self.step_tokens = step_budget(limits.step_tokens, runner.chunk)  # prompt rows a step may take (shape_free)
        self.inbox, self.control = inbox, control
        self.held_last = False  # whether the latest step held the first read in line back (held_back)
        self.trace = StepTrace()  # a line per step on stderr with $STRATA_STEP_TRACE
        self.decoding = DecodeSteps(runner, memory, admission, write, self.trace)
        self.decode_step, self.draw = self.decoding.step, self.decoding.draw
        self.pauses = ReadPauses(runner, requests, self.decode_step, limits.interval_ms,  # a long step's decode steps
                                 self.read_newcomers)

    def take_lines(self) -> None:
        """The control lines that arrived meanwhile, handled without waiting."""
        self.inbox.take(self.control, block=False)

    def round(self) -> None:
        self.memory.bring_back()
        decoding = self.requests.decoding()
        if decoding:
            started = time.perf_counter()
            self.decode_step(decoding)
            self.pauses.decoded(started)
            if self.requests.line:  # the read in front waited for it
                self.requests.line[0].shared_ms += (time.perf_counter() - started) * 1000
            self.take_lines()
        self.memory.report_now_and_then()
        started = time.perf_counter()
        while (pieces := self.plan_reads()) and not self.inbox.gone:
            self.read_step(pieces)
            reader = self.requests.next_reader()
            if self.inbox.gone or reader is None or not self.requests.any_decoding():
                break  # nobody waits for a step: the next round reads on (taking control lines first)
            rows = min(reader.total - reader.pos, self.step_rows(reader))  # (about: the next step's first read's rows)
            estimate = self.pauses.estimate_ms(reader, rows) or 0.0
            if (time.perf_counter() - started) * 1000 + estimate > self.limits.interval_ms:
                break  # the decoders have waited about interval_ms: their step comes first

    # ------------------------------------------------------------ prompt chunks

    def plan_reads(self) -> list[tuple[Sequence, int]]:
        """The next prompt step: (read, the position its rows end at) for the first read in line and,
        when rows may share a step, the reads behind it while step_tokens allows, each with its
        blocks had first. Empty if nobody reads (or the first read could not have its blocks)."""
        readers = self.requests.readers()
        if not readers:
            return []
        held = self.held_back(readers)
        first = next(seq for seq in readers if seq not in held)
        budget = self.step_rows(first)
        end = self.piece_end(first, budget)
        if not self.memory.get_blocks(first, end):
            self.short_of_blocks(first)
            return []
        pieces, keys = [(first, end)], end
        self.requests.in_step = [first]  # the reads chosen: the blocks had for the next ones never come from them
        left = budget - (end - first.pos)
        # a step that a short read leads: the reads that end in it take a chunk's rows in all (burst_rows)
        burst = self.burst_rows(budget) - (end - first.pos) if end == first.total else None
        for seq in self.requests.readers() if self.runner.shape_free else ():  # (as the first's blocks left them:
            # room for it may have paused a newer read, or dropped an answer read again)
            if seq is first or seq in held:
                continue
            if left <= 0:
                break
            if seq not in self.requests.line or seq.paused:
                continue  # let go by a companion's blocks (an answer read again) in this loop
            end = self.piece_end(seq, left)
            if end <= seq.pos:
                continue  # too few rows left in the step for this read's next piece
            if burst is not None and end == seq.total:
                if end - seq.pos > burst:
                    continue  # a short read past the burst's rows: the next step's (a long one's piece still goes)
                burst -= end - seq.pos
            if self.runner.step_keys is not None and keys + end > self.runner.step_keys:
                break  # the step's keys would not fit the scratch its attention widens them into
            if not self.memory.get_blocks(seq, end, pause_others=False):
                break  # a read behind the first waits for room rather than take it from others
            pieces.append((seq, end))
            self.requests.in_step.append(seq)
            keys += end
            left -= end - seq.pos
        self.requests.in_step = []
        return pieces

    def step_rows(self, first: Sequence) -> int:
        """The rows the next prompt step may take, first its first read: step_tokens, and while others decode, as
        many as keep its time within step_ms by first's latest step (where rows may share a step and so end
        anywhere; a read's first step has no such estimate: other steps' time a row says little of its own)."""
        if not (self.runner.shape_free and self.requests.any_decoding()):
            return self.step_tokens
        return self.limits.capped_rows(self.step_tokens, first.row_ms)

    def burst_rows(self, budget: int) -> int:
        """The rows that reads ending in a step may take in all where one leads it (a burst of short reads: sixteen
        sub-agents' tails, 64 clients' prompts): a chunk's at most, so that the first of them are answered after a
        short step, not after one step of all (sixteen tails of ~350 rows: TTFT p50 0.18 s at a chunk's rows a
        step, 0.24 s at two chunks', the last about the same; bench/HISTORY.md, seventeenth session). A long
        read behind them still takes its piece of the rest of step_tokens, and a long read's chunk leading a step
        leaves the rest to the reads behind it as before."""
        return min(budget, self.runner.chunk)

    def held_back(self, readers: list[Sequence]) -> list[Sequence]:
        """The reads whose chunks wait a step: where rows may share a step and the first read in line will
        not end its read in this one while reads behind it end theirs within a chunk (a short newcomer
        beside a long read), every read that will not end in this step, so that the short ones get a step
        of their own: a newcomer's first token comes after the step in progress and its own short one, not
        after a long chunk too. Every other step at most: a long read never waits two steps in a row."""
        chunk = self.runner.chunk
        long = [seq for seq in readers if seq.total - seq.pos > chunk]
        hold = (self.runner.shape_free and not self.held_last and bool(long) and long[0] is readers[0]
                and len(long) < len(readers))
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

    def short_of_blocks(self, reader: Sequence) -> None:
        """The first read in line cannot have the blocks of its next rows."""
        if any(s.table for s in self.requests.seqs.values() if s is not reader) or self.memory.paused:
            self.memory.pause(reader)  # the newest needing room gives its own up, so that older ones go on
        else:  # alone and still short of room: the pool is smaller than one request (a bug, not a wait)
            pool = self.memory.pool
            self.admission.drop(reader, f"the KV pool ({pool.total} blocks of {pool.size}) cannot hold "
                                        f"this request's next chunk")

    def read_newcomers(self, left_ms: float) -> None:
        """In a long prompt step's pause for the decoders (engine/loop/read_pauses.py), where rows do not depend on
        the step: the lines that came meanwhile, then the reads that came and end within a step, read now in a step
        of their own, their first token in the pause, not after the long step that the decoders' steps stretch (2,048
        rows of the 80B hybrid ~0.7 s beside 64 decoders: bench/HISTORY.md, fourteenth session). Only where that
        shortens the waits in all and never holds the step's own reads past twice their wait: the newcomers' reads
        in this step's pauses so far and now, which each of the step's reads then waits, times their count, under the
        step's own time left (left_ms), which each newcomer would wait (sub-agents' reads went before a step of three
        such and held it 0.37 s: fifteenth session; 64 clients' prompts, a few at each pause of a step of two, held
        those two 0.9-1.7 s: seventeenth). The step's reads stay in_step (a STOP waits)."""
        if not self.runner.shape_free:
            return  # (one read a step: the server parks the long read for a newcomer instead)
        self.take_lines()
        outer, left, keys, pieces = self.requests.in_step, min(self.step_tokens, self.runner.chunk), 0, []
        lent = self.pauses.lent_ms  # (the newcomers' reads in this step's pauses so far, and the ones chosen now)
        for seq in self.requests.readers():
            if seq in outer or seq.settling or seq.pos > seq.cached or seq.total - seq.pos > left:
                continue
            estimate = self.pauses.estimate_ms(seq, seq.total - seq.pos)
            if estimate is None or (lent + estimate) * len(outer) >= left_ms:  # (outer: the pausing step's reads)
                continue
            if self.runner.step_keys is not None and keys + seq.total > self.runner.step_keys:
                break
            if not self.memory.get_blocks(seq, seq.total, pause_others=False):
                break
            pieces.append((seq, seq.total))
            left, keys, lent = left - (seq.total - seq.pos), keys + seq.total, lent + estimate
        if pieces:
            self.pauses.lent_ms = lent  # (by the estimates the rule weighs, as left_ms is)
            self.read_step(pieces, outer)

    def read_step(self, pieces: list[tuple[Sequence, int]], outer: list[Sequence] | tuple = ()) -> None:
        """One prompt step over `pieces`; then each read's PP, and its first token, park or end. outer: the reads of
        the long step in whose pause this one runs (read_newcomers), its own pauses none."""
        started = time.perf_counter()
        before = [seq.pos for seq, _ in pieces]
        self.requests.in_step = [*outer, *(seq for seq, _ in pieces)]
        rows = sum(end - pos for (_, end), pos in zip(pieces, before))
        self.runner.read_prompts(pieces, None if outer else self.pauses.plan(pieces[0][0], rows))
        ms = (time.perf_counter() - started) * 1000  # PP reports the wall time, pauses included
        paused_ms = 0.0 if outer else self.pauses.paused_ms
        own_ms = ms - paused_ms  # the step's own time, without its pauses
        self.pauses.observe(rows, own_ms)
        self.trace.step("prompt", started, rows=rows,
                        reads=[[seq.id, pos, end] for (seq, end), pos in zip(pieces, before)],
                        paused_ms=round(paused_ms, 2))
        size = self.memory.pool.size if self.runner.shape_free else self.runner.chunk
        for seq, _ in pieces:  # shareable now: whole blocks (rows that are the same in any step), else whole chunks
            keys = self.memory.pool.register(seq.table, seq.prompt, seq.pos // size * size)
            if seq.state is not None:  # a hybrid's recurrent state at its mark, for its prefix
                self.runner.state_cache.keep(keys, seq.state.mark_at, seq.state.mark)
            if seq.settling:  # an answer read again: its whole blocks shared, its blocks back once done
                if not seq.reading:
                    self.memory.drop_settling(seq)
                continue
            seq.row_ms = own_ms / max(rows, 1)
            seq.prompt_ms += own_ms
            seq.shared_ms += paused_ms
        self.take_lines()  # lines that arrived during this step, before its PPs
        self.requests.in_step = list(outer)
        if not outer:  # (the long step's answers read again, let go, are dropped once it is done)
            self.memory.drop_let_go()
        self.runner.pick_ahead([seq for seq, _ in pieces  # the first tokens the loop below draws, at once on a GPU
                                if not seq.settling and seq.finish is None and not seq.reading and seq.pool is None])
        for (seq, _), pos in zip(pieces, before):
            if seq.settling:
                continue
            for line in seq.scorer.take(seq.id) if seq.scorer is not None else ():  # prompt log-probabilities
                self.write(line)
            self.write(m.PromptProgress(seq.pos, seq.total, ms, (seq.pos - pos) / max(ms, 1e-6) * 1000, seq.id))
            if seq.finish is not None:  # a STOP came during the step
                self.admission.finish(seq, seq.finish)
            elif not seq.reading:
                self.requests.line.remove(seq)
                seq.yield_wanted = False  # decode never parks
                if seq.pool is not None:  # an embed request: its pooled vector instead of a token, and its DONE
                    self.admission.embedded(seq)
                else:
                    self.draw(seq, time.perf_counter())  # its first token now, not after the next decode step
            elif seq.yield_wanted:
                self.parking.try_park(seq)
