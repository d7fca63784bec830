"""The engine's protocol loop: a stdin thread feeds an inbox; one sequence runs at a time.

Control lines (STOP, YIELD, CANCEL) are looked at between prompt chunks and between tokens.
"""
from __future__ import annotations

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


class Parked:
    def __init__(self, seq: Sequence, snapshot, nbytes: int):
        self.seq, self.snapshot, self.nbytes = seq, snapshot, nbytes


class EngineLoop:
    def __init__(self, runner, policy: ParkPolicy, write: Callable[[m.Message], None],
                 caps: tuple[str, ...] = ("stop",)):
        self.runner, self.policy, self.write = runner, policy, write
        self.caps = caps
        self.inbox: queue.Queue = queue.Queue()
        self.parked: dict[int, Parked] = {}
        self.yield_offered = False
        self.quitting = False
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

    def process(self) -> None:
        """Handle the inbox until QUIT or end of input."""
        while not self.quitting:
            msg = self.inbox.get()
            if msg is _EOF or isinstance(msg, m.Quit):
                break
            self.dispatch_idle(msg)

    # ------------------------------------------------------------ idle dispatch

    def dispatch_idle(self, msg: m.Message) -> None:
        if isinstance(msg, m.Gen):
            seq = self.start(msg)
            if seq is not None:
                self.run(seq)
        elif isinstance(msg, m.Resume):
            self.resume(msg.id)
        elif isinstance(msg, m.Cancel):
            self.cancel_parked(msg.id)
        elif isinstance(msg, (m.Stop, m.Yield)):
            pass  # nothing is running: a late STOP or a stale offer
        else:
            self.write(m.Err(f"unexpected {type(msg).__name__.upper()} line for an engine", msg.id))

    def start(self, gen: m.Gen) -> Sequence | None:
        try:
            return self.build_sequence(gen)
        except ValueError as e:
            self.write(m.Err(str(e), gen.id))
            return None

    def build_sequence(self, gen: m.Gen) -> Sequence:
        if gen.id is not None and gen.id in self.parked:
            raise ValueError(f"id {gen.id} is already parked")
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

    # ------------------------------------------------------------ running

    def run(self, seq: Sequence) -> None:
        while seq.reading:
            started = time.perf_counter()
            before = seq.pos
            self.runner.read_prompt_chunk(seq)
            ms = (time.perf_counter() - started) * 1000
            seq.prompt_ms += ms
            stop = self.poll_control(seq)  # lines that arrived during this chunk, before its PP
            self.write(m.PP(seq.pos, seq.total, ms, (seq.pos - before) / max(ms, 1e-6) * 1000, seq.id))
            if stop:
                return self.finish(seq, "cancel")
            if self.yield_offered and seq.reading and self.try_park(seq):
                return
        self.yield_offered = False  # decode never parks
        self.decode(seq)

    def decode(self, seq: Sequence) -> None:
        started = time.perf_counter()
        while seq.finish is None:
            token = self.runner.sample(seq)
            seq.sampler.accept(token)
            seq.generated.append(token)
            self.write(m.T(token, seq.id))
            if token in seq.stop_ids:
                seq.finish = "stop"
            elif len(seq.generated) >= seq.max_new:
                seq.finish = "length"
            elif self.poll_control(seq):
                seq.finish = "cancel"
            else:
                self.runner.decode_one_token(seq)
        seq.decode_ms = (time.perf_counter() - started) * 1000
        self.finish(seq, seq.finish)

    def finish(self, seq: Sequence, reason: str) -> None:
        extra = {"parks": str(seq.parks), "park_ms": f"{seq.park_ms:.3f}"}
        if seq.fingerprints:
            extra["fp"] = self.runner.fingerprint(seq)
        self.write(m.Done(len(seq.generated), seq.total, seq.prompt_ms, seq.decode_ms, reason, extra, seq.id))

    def poll_control(self, seq: Sequence) -> bool:
        """Handle control lines that arrived meanwhile; True if `seq` must stop."""
        stop = False
        while True:
            try:
                msg = self.inbox.get_nowait()
            except queue.Empty:
                return stop
            stop = self.control(seq, msg) or stop

    def control(self, seq: Sequence, msg) -> bool:
        if msg is _EOF:  # nobody is listening any more: stop now
            self.quitting = True
            return True
        if isinstance(msg, m.Quit):  # finish what runs, then exit
            self.quitting = True
        elif isinstance(msg, m.Stop):
            return msg.id is None or msg.id == seq.id
        elif isinstance(msg, m.Yield):
            self.yield_offered = seq.reading
        elif isinstance(msg, m.Cancel):
            self.cancel_parked(msg.id)
        elif isinstance(msg, (m.Gen, m.Resume)):
            self.write(m.Err(f"busy: request {seq.id} is running", msg.id))
        return False

    # ------------------------------------------------------------ park / resume

    def try_park(self, seq: Sequence) -> bool:
        self.yield_offered = False  # the park (or its refusal) consumes the offer
        nbytes = self.runner.snapshot_nbytes(seq)
        used = sum(p.nbytes for p in self.parked.values())
        reason = self.policy.decline_reason(seq, nbytes, used, len(self.parked))
        if reason == "budget":
            self.log_once("budget", f"park declined: a {nbytes >> 20} MiB snapshot would exceed the "
                                    f"{self.policy.budget_bytes >> 20} MiB budget ({used >> 20} MiB in use)")
        if reason is None:
            try:
                snapshot = self.timed_copy(seq, self.runner.park)
            except Exception as e:  # MemoryError, CuPy's OutOfMemoryError, ...: keep reading
                self.log_once("snapshot_failed", f"snapshot copy failed ({type(e).__name__}: {e}); "
                                                 "the read continues unparked")
                reason = "snapshot_failed"
        if reason is not None:
            self.write(m.Decline(reason, seq.pos, seq.total, seq.id))
            return False
        seq.parks += 1
        self.parked[seq.id] = Parked(seq, snapshot, nbytes)
        self.write_fingerprint(seq, "park")
        self.write(m.Suspended(seq.pos, seq.total, seq.id))
        return True

    def resume(self, ident: int) -> None:
        parked = self.take_parked(ident)
        if parked is None:
            return
        self.timed_copy(parked.seq, self.runner.restore, parked.snapshot)
        self.yield_offered = False  # a fresh period waits for a fresh offer
        self.write_fingerprint(parked.seq, "resume")
        self.run(parked.seq)

    def cancel_parked(self, ident: int) -> None:
        parked = self.take_parked(ident)
        if parked is not None:
            self.finish(parked.seq, "cancel")

    def take_parked(self, ident: int) -> Parked | None:
        parked = self.parked.pop(ident, None)
        if parked is None:
            self.write(m.Err(f"no parked request with id {ident}", ident))
        return parked

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


def run_loop(runner, policy: ParkPolicy) -> None:
    EngineLoop(runner, policy, Writer(sys.stdout), engine_caps(policy)).serve(sys.stdin)
