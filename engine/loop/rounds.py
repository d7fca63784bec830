"""What one round runs: a decode step for every decoding request, then prompt steps, and the
tokens drawn and written out.

A round is one decode step for every decoding request together (one pass over the weights), then
prompt steps while the decoders have waited less than `interval_ms` (at least one step; `burst_ms` for a
burst of short reads: StepLimits.wait_ms), so that a long read never stops the others from decoding and
reads get the time the interval allows. What a
prompt step reads (which reads, how many rows of each) is engine/loop/step_plan.py's: where the kernels'
rows do not depend on the step's shape, several reads share a step, each ending anywhere; else one read a
step, its next chunk at absolute boundaries.
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
from engine.core.chunks import step_budget
from engine.loop.parking import Parking
from engine.loop.protocol_io import Inbox
from engine.loop.read_pauses import ReadPauses
from engine.loop.request_table import RequestTable
from engine.loop.step_limits import StepLimits
from engine.loop.step_plan import StepPlan
from engine.loop.step_trace import StepTrace
from engine.runner.sequence import Sequence


class Rounds:
    def __init__(self, runner, requests: RequestTable, memory: Memory, parking: Parking, admission: Admission,
                 write: Callable[[m.Message], None], inbox: Inbox, control: Callable[[m.Message], None],
                 limits: StepLimits = StepLimits()):
        self.runner, self.requests, self.memory, self.parking = runner, requests, memory, parking
        self.admission, self.write, self.limits = admission, write, limits
        self.step_tokens = step_budget(limits.step_tokens, runner.chunk)  # prompt rows a step may take (shape_free)
        self.plan = StepPlan(runner, requests, memory, limits, self.step_tokens, self.short_of_blocks)
        self.inbox, self.control = inbox, control
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
        started, idle = time.perf_counter(), not decoding
        while (pieces := self.plan.pieces()) and not self.inbox.gone:
            self.read_step(pieces)
            reader = self.requests.next_reader()
            if self.inbox.gone or reader is None or not self.requests.any_decoding():
                break  # nobody waits for a step: the next round reads on (taking control lines first)
            if idle:  # the first decoders' wait for their next token starts at their first
                started, idle = self.pauses.decoded_at, False
            rows = min(reader.total - reader.pos, self.plan.step_rows(reader))  # (about: the next step's first read's)
            estimate = self.pauses.estimate_ms(reader, rows) or 0.0
            if (time.perf_counter() - started) * 1000 + estimate > self.wait_ms(self.short(reader)):
                break  # the decoders have waited about interval_ms (burst_ms for short reads): their step comes first
        if self.requests.any_decoding():
            self.pauses.reads_done()  # (held past the interval by a burst: as long at their pace before the next)

    def short(self, seq: Sequence) -> bool:
        """Whether seq's read, past its cached prefix, is a chunk or less: a short read, whose first token a burst of
        them waits for (StepLimits.wait_ms); a long read's last chunk is not one (its steps pause at the interval)."""
        return seq.total - seq.cached <= self.runner.chunk

    def wait_ms(self, short: bool) -> float:
        """How long the decoders may wait for their next step while prompt steps run (StepLimits.wait_ms): a burst's
        budget for short reads, where the last burst has left them their pace since (ReadPauses.may_burst)."""
        return self.limits.wait_ms(short and self.pauses.may_burst())

    # ------------------------------------------------------------ prompt chunks

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
        started, idle = time.perf_counter(), not self.requests.any_decoding()
        before = [seq.pos for seq, _ in pieces]
        self.requests.in_step = [*outer, *(seq for seq, _ in pieces)]
        rows = sum(end - pos for (_, end), pos in zip(pieces, before))
        wait_ms = self.wait_ms(all(self.short(seq) for seq, _ in pieces))
        self.runner.read_prompts(pieces, None if outer else self.pauses.plan(pieces[0][0], rows, wait_ms))
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
        if idle and self.requests.any_decoding():
            self.pauses.decoding_began()
