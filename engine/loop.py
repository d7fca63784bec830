"""The engine's protocol loop: a stdin thread feeds an inbox; the requests in the engine's slots
advance in rounds.

A round is one decode step for every decoding request together (one pass over the weights), then
one prompt chunk of the first read in line, so that a long read never stops the others from
decoding and a read's chunks stay at absolute boundaries. A chunk deep in a long read takes longer
than a decoding client should wait for its next token, so it pauses between layers for further
decode steps, about every `interval_ms` (the layers per pause estimated from the read's last
chunk); the pauses change neither the chunk's arithmetic nor its boundaries. Control lines (GEN,
STOP, YIELD, RESUME, CANCEL) are taken between rounds and after each chunk, before its PP.

Parks stay in place: a parked read keeps its rows in its slot, at no cost. When a GEN or a RESUME
finds no free slot, the read parked longest moves to host memory (its snapshot) and gives its slot
up; its RESUME brings the rows back into a free slot. The park gates reserve room in the one
snapshot budget for every parked read, so a move never exceeds it; if the copy itself fails, the
read's rows are dropped and it reads again from its start when resumed (the same tokens: chunks
are absolute).
"""
from __future__ import annotations

import itertools
import queue
import sys
import threading
import time
from dataclasses import fields
from typing import Callable, TextIO

from protocol import messages as m
from protocol.codec import ProtocolError, decode, encode

from engine.prefill import ParkPolicy
from engine.sampler import Sampler, SamplingParams
from engine.sequence import Sequence
from engine.slots import SlotTable

_SAMPLING_KEYS = {f.name for f in fields(SamplingParams)}
_EOF = object()


class Writer:
    """Serialized line output (the stdin thread writes ERR lines too)."""

    def __init__(self, out: TextIO):
        self.out, self.lock = out, threading.Lock()

    def __call__(self, msg: m.Message) -> None:
        self.raw(encode(msg))

    def raw(self, line: str) -> None:
        with self.lock:
            self.out.write(line + "\n")
            self.out.flush()


class EngineLoop:
    def __init__(self, runner, policy: ParkPolicy, write: Callable[[m.Message], None],
                 caps: tuple[str, ...] = ("stop",), reuse: bool = True, interval_ms: float = 0.0):
        self.runner, self.policy, self.write = runner, policy, write
        self.caps, self.reuse, self.interval_ms = caps, reuse, interval_ms
        self.inbox: queue.Queue = queue.Queue()
        self.slots = SlotTable(runner.slots, runner.chunk)
        self.seqs: dict[int | None, Sequence] = {}  # every request in the engine, by id, in arrival order
        self.line: list[Sequence] = []  # reads in order: the first one reads the next chunk
        self.snapshots: dict[int, object] = {}  # spilled parked reads' rows (None: dropped, read again)
        self.reserved: dict[int, int] = {}  # parked reads' snapshot sizes, held in the budget
        self.park_ticks = itertools.count(1)
        self.in_chunk: Sequence | None = None  # the read whose chunk runs or has run and whose PP is not out yet
        self.chunk_ms: float | None = None  # the latest chunk's own time (any read), without its pauses
        self.paused_ms = 0.0  # decode steps run in the pauses of the current chunk
        self.quitting = False  # QUIT: finish what runs, then exit
        self.gone = False  # end of input: nobody listens any more
        self.logged: set[str] = set()

    def log_once(self, kind: str, text: str) -> None:
        if kind not in self.logged:
            self.logged.add(kind)
            print(f"strata: {text}", file=sys.stderr, flush=True)

    # ------------------------------------------------------------ input

    def read_stdin(self, stdin: TextIO) -> None:
        for line in iter(stdin.readline, ""):
            if not line.strip():
                continue
            try:
                self.inbox.put(decode(line))
            except ProtocolError as e:
                self.write(m.Err(str(e), e.id))
        self.inbox.put(_EOF)

    def serve(self, stdin: TextIO) -> None:
        self.announce()
        threading.Thread(target=self.read_stdin, args=(stdin,), daemon=True).start()
        self.process()

    def announce(self) -> None:
        self.write(m.Info(self.runner.info()))
        self.write(m.Ready(self.runner.ctx, self.caps))

    @property
    def busy(self) -> bool:
        """Some request reads or decodes (parked ones wait for a RESUME)."""
        return any(not s.parked for s in self.seqs.values())

    def process(self) -> None:
        """Rounds until QUIT (once what runs has finished) or the end of input."""
        while True:
            self.take_lines(block=not self.busy and not self.quitting)
            if self.gone or (self.quitting and not self.busy):
                return
            self.round()

    def take_lines(self, block: bool) -> None:
        """Handle the lines that arrived; with block, wait for one first (the engine is idle)."""
        while not self.gone:
            try:
                msg = self.inbox.get(block=block)
            except queue.Empty:
                return
            block = False
            if msg is _EOF:
                self.gone = True
            else:
                self.control(msg)

    # ------------------------------------------------------------ lines

    def control(self, msg: m.Message) -> None:
        if isinstance(msg, m.Gen):
            self.admit(msg)
        elif isinstance(msg, m.Quit):
            self.quitting = True
        elif isinstance(msg, m.Stop):
            for seq in [s for s in self.seqs.values() if msg.id is None or s.id == msg.id]:
                self.stop(seq)
        elif isinstance(msg, m.Yield):
            target = self.seqs.get(msg.id) if msg.id is not None else (self.line[0] if self.line else None)
            if target is not None and target.reading and not target.parked:
                target.yield_wanted = True  # honoured at its next chunk boundary; decode never parks
        elif isinstance(msg, m.Resume):
            self.resume(msg.id)
        elif isinstance(msg, m.Cancel):
            seq = self.seqs.get(msg.id)
            if seq is None or not seq.parked:
                self.write(m.Err(f"no parked request with id {msg.id}", msg.id))
            else:
                self.finish(seq, "cancel")
        else:
            self.write(m.Err(f"unexpected {type(msg).__name__.upper()} line for an engine", msg.id))

    def stop(self, seq: Sequence) -> None:
        """STOP: the request ends with `cancel` (after the PP of a chunk that has just run)."""
        if seq is self.in_chunk:
            seq.finish = "cancel"
        else:
            self.finish(seq, "cancel")

    def admit(self, gen: m.Gen) -> None:
        try:
            seq = self.build_sequence(gen)
        except ValueError as e:
            self.write(m.Err(str(e), gen.id))
            return
        if not self.take_slot(seq, reuse=self.reuse and bool(gen.params.get("reuse", 1))):
            self.write(m.Err(f"busy: all {len(self.slots)} slots are in use", gen.id))
            return
        self.seqs[seq.id] = seq
        self.line.append(seq)
        self.write(m.Info({"slot": str(seq.slot), "cached": str(seq.cached)}, seq.id))  # where it landed, what it reuses

    def build_sequence(self, gen: m.Gen) -> Sequence:
        if gen.id in self.seqs:
            raise ValueError(f"id {gen.id} is already in the engine" if gen.id is not None else
                             "busy: a request without an id is running")
        if len(gen.tokens) >= self.runner.ctx:
            raise ValueError(f"prompt of {len(gen.tokens)} tokens does not fit the context of {self.runner.ctx}")
        bad = [t for t in gen.tokens if t >= self.runner.vocab_size]
        if bad:
            raise ValueError(f"token id {bad[0]} is outside the vocabulary of {self.runner.vocab_size}")
        if gen.max_new < 1:
            raise ValueError("max_new must be >= 1")
        drawn = gen.params.get("drawn", 0)
        if not 0 <= drawn < len(gen.tokens):
            raise ValueError(f"drawn={drawn} must be >= 0 and shorter than the prompt")
        params = {k: v for k, v in gen.params.items() if k in _SAMPLING_KEYS}
        sampling = SamplingParams(**params)
        constraint = None
        if "grammar" in gen.params:
            constraint = self.runner.constraint(gen.params["grammar"])
            for token in gen.tokens[len(gen.tokens) - drawn:]:  # a continuation's tokens so far
                constraint.accept(token)
        return Sequence(
            id=gen.id, prompt=gen.tokens, max_new=min(gen.max_new, self.runner.ctx - len(gen.tokens)),
            sampler=Sampler(sampling, gen.tokens, drawn, constraint),
            stop_ids=self.runner.eos_ids | frozenset(sampling.stop),
            fingerprints=bool(gen.params.get("fp", 0)), drawn=drawn)

    # ------------------------------------------------------------ rounds

    def round(self) -> None:
        decoding = [s for s in self.seqs.values() if s.decoding]
        if decoding:
            started = time.perf_counter()
            self.decode_step(decoding)
            if self.line:  # the read in front waited for it
                self.line[0].shared_ms += (time.perf_counter() - started) * 1000
            self.take_lines(block=False)
        if self.line:
            self.read_chunk(self.line[0])

    def decode_step(self, seqs: list[Sequence]) -> None:
        """Each decoding request's next token from its logits, then one batched forward for those
        that go on."""
        going = []
        now = time.perf_counter()
        for seq in seqs:
            if seq.decode_started is None:
                seq.decode_started = now
            token = self.runner.sample(seq)
            seq.sampler.accept(token)
            seq.generated.append(token)
            self.write(m.T(token, seq.id))
            if token in seq.stop_ids:
                self.finish(seq, "stop")
            elif len(seq.generated) >= seq.max_new:
                self.finish(seq, "length")
            else:
                going.append(seq)
        if going:
            self.runner.decode_batch(going)

    def read_chunk(self, seq: Sequence) -> None:
        started = time.perf_counter()
        before = seq.pos
        self.in_chunk, self.paused_ms = seq, 0.0
        self.runner.read_prompt_chunk(seq, self.pauses(seq))
        ms = (time.perf_counter() - started) * 1000  # PP reports the wall time, pauses included
        self.chunk_ms = seq.chunk_ms = ms - self.paused_ms
        seq.prompt_ms += seq.chunk_ms
        seq.shared_ms += self.paused_ms
        self.take_lines(block=False)  # lines that arrived during this chunk, before its PP
        self.in_chunk = None
        self.write(m.PP(seq.pos, seq.total, ms, (seq.pos - before) / max(ms, 1e-6) * 1000, seq.id))
        if seq.finish is not None:  # a STOP came during the chunk
            self.finish(seq, seq.finish)
        elif not seq.reading:
            self.line.remove(seq)
            seq.yield_wanted = False  # decode never parks
        elif seq.yield_wanted:
            self.try_park(seq)

    def pauses(self, seq: Sequence) -> Callable[[int], None] | None:
        """The chunk's pauses between layers (None: it runs straight through): every `every` layers,
        a decode step for the requests decoding then, so that each waits about interval_ms for its
        next token. The chunk's time is estimated by the read's last chunk, else the latest chunk
        of any read (a first chunk is the shallowest: its estimate errs long, pausing more)."""
        estimate, layers = seq.chunk_ms or self.chunk_ms, self.runner.layers
        if not (self.interval_ms and estimate and any(s.decoding for s in self.seqs.values())):
            return None
        every = max(1, int(layers * self.interval_ms / estimate))
        if every >= layers:
            return None

        def pause(layer: int) -> None:
            if (layer + 1) % every:
                return
            decoding = [s for s in self.seqs.values() if s.decoding]
            if not decoding:
                return
            self.runner.synchronize()  # the layers so far are done: what follows is the step's own time
            started = time.perf_counter()
            self.decode_step(decoding)
            self.runner.synchronize()
            self.paused_ms += (time.perf_counter() - started) * 1000

        return pause

    def finish(self, seq: Sequence, reason: str) -> None:
        seq.finish = reason
        if seq.decode_started is not None:
            seq.decode_ms = (time.perf_counter() - seq.decode_started) * 1000
        extra = {"parks": str(seq.parks), "park_ms": f"{seq.park_ms:.3f}", "cached": str(seq.cached),
                 "shared_ms": f"{seq.shared_ms:.3f}"}
        if seq.fingerprints and seq.slot is not None:
            extra["fp"] = self.runner.fingerprint(seq)
        self.write(m.Done(len(seq.generated), seq.total, seq.prompt_ms, seq.decode_ms, reason, extra, seq.id))
        self.seqs.pop(seq.id, None)
        if seq in self.line:
            self.line.remove(seq)
        self.snapshots.pop(seq.id, None)
        self.reserved.pop(seq.id, None)
        self.slots.release(seq, keep=True)

    # ------------------------------------------------------------ park, move out, resume

    def try_park(self, seq: Sequence) -> None:
        seq.yield_wanted = False  # the park (or its refusal) consumes the offer
        nbytes = self.runner.snapshot_nbytes(seq)
        used = sum(self.reserved.values())
        reason = self.policy.decline_reason(seq, nbytes, used, len(self.reserved))
        if reason == "budget":
            self.log_once("budget", f"park declined: a {nbytes >> 20} MiB snapshot would exceed the "
                                    f"{self.policy.budget_bytes >> 20} MiB budget ({used >> 20} MiB in use)")
        if reason is not None:
            self.write(m.Decline(reason, seq.pos, seq.total, seq.id))
            return
        self.runner.park(seq)
        seq.parks += 1
        seq.parked, seq.parked_seq = True, next(self.park_ticks)
        self.reserved[seq.id] = nbytes
        self.line.remove(seq)
        self.write_fingerprint(seq, "park")
        self.write(m.Suspended(seq.pos, seq.total, seq.id))

    def take_slot(self, seq: Sequence, reuse: bool) -> bool:
        """A slot for `seq`: a free one, else the one of the read parked longest, moved out."""
        if self.slots.place(seq, reuse):
            return True
        in_place = [s for s in self.seqs.values() if s.parked and s.slot is not None and s is not seq]
        if not in_place:
            return False
        self.move_out(min(in_place, key=lambda s: s.parked_seq))
        return self.slots.place(seq, reuse)

    def move_out(self, seq: Sequence) -> None:
        """A parked read's rows to host memory (within the budget its park reserved); its slot is free."""
        try:
            self.snapshots[seq.id] = self.timed_copy(seq, self.runner.spill)
        except Exception as e:  # MemoryError, CuPy's OutOfMemoryError, ...: it will read again
            self.log_once("snapshot_failed", f"moving a parked read out failed ({type(e).__name__}: {e}); "
                                             "it will read its prompt again when resumed")
            self.write(m.Decline("snapshot_failed", seq.pos, seq.total, seq.id))
            self.snapshots[seq.id] = None
        self.slots.release(seq, keep=False)
        self.write(m.Info({"slot": "-1"}, seq.id))  # in host memory now

    def resume(self, ident: int) -> None:
        seq = self.seqs.get(ident)
        if seq is None or not seq.parked:
            self.write(m.Err(f"no parked request with id {ident}", ident))
            return
        if seq.slot is None:  # moved out: back into a slot
            if not self.take_slot(seq, reuse=False):
                self.write(m.Err(f"busy: all {len(self.slots)} slots are in use", ident))
                return
            self.write(m.Info({"slot": str(seq.slot)}, ident))
            snap = self.snapshots.pop(seq.id)
            if snap is None:
                seq.pos = 0  # its rows were dropped: the read starts again (the same chunks)
            else:
                self.timed_copy(seq, self.runner.restore, snap)
        seq.parked = False
        self.reserved.pop(seq.id, None)
        self.write_fingerprint(seq, "resume")
        self.line.append(seq)

    def write_fingerprint(self, seq: Sequence, stage: str) -> None:
        if seq.fingerprints:
            self.write(m.FP(stage, seq.pos, self.runner.fingerprint(seq), seq.id))

    @staticmethod
    def timed_copy(seq: Sequence, copy, *args):
        """A snapshot copy (out or back in); its time is the park's cost, reported in DONE."""
        started = time.perf_counter()
        result = copy(seq, *args)
        seq.park_ms += (time.perf_counter() - started) * 1000
        return result


def engine_caps(policy: ParkPolicy) -> tuple[str, ...]:
    return ("stop", "preempt") if policy.enabled else ("stop",)


def run_loop(runner, policy: ParkPolicy, reuse: bool = True, interval_ms: float = 0.0) -> None:
    EngineLoop(runner, policy, Writer(sys.stdout), engine_caps(policy), reuse, interval_ms).serve(sys.stdin)
