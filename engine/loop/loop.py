"""The engine's protocol loop: a stdin thread feeds an inbox; the requests in the engine advance
in rounds. Control lines (GEN, STOP, YIELD, RESUME, CANCEL, QUIT) are taken between rounds, after a
round's decode step and after each chunk, before its PP.

EngineLoop only wires its parts and dispatches the lines, each part owning its state:
  protocol_io.py    the inbox of decoded lines, the line writer
  request_table.py  the requests in the engine (arrival order, the reads in line)
  admission.py      GEN in (or DEFER), DONE and ERR out
  memory.py         KV blocks under pressure: parked reads moved out, running requests paused
  parking.py        park at a chunk boundary (YIELD), resume (RESUME)
  rounds.py         one round: a batched decode step, then prompt chunks; tokens drawn and written
  step_limits.py    what bounds the steps (the decoders' interval, a step's rows and time)
  ahead_captures.py the decode graphs an idle engine captures before their first use
  ahead_copies.py   the host tier's copies made before an eviction needs them (idle, and on a GPU between steps)
"""
from __future__ import annotations

import sys
from typing import Callable, TextIO

from protocol import messages as m
from protocol.codec import verb

from engine.core.memory import out_of_memory
from engine.loop.admission import Admission
from engine.loop.ahead_captures import IDLE_S, AheadCaptures
from engine.loop.ahead_copies import AheadCopies
from engine.loop.memory import Memory
from engine.loop.park_policy import ParkPolicy
from engine.loop.parking import Parking
from engine.loop.protocol_io import Inbox, LogOnce, Writer
from engine.loop.request_table import RequestTable
from engine.loop.rounds import Rounds
from engine.loop.step_limits import StepLimits
from engine.runner.sequence import Sequence


class EngineLoop:
    def __init__(self, runner, policy: ParkPolicy, write: Callable[[m.Message], None],
                 caps: tuple[str, ...] = ("stop",), reuse: bool = True, limits: StepLimits = StepLimits()):
        self.runner, self.write, self.caps = runner, write, caps
        self.inbox = Inbox()
        self.requests = RequestTable()
        log_once = LogOnce()
        self.memory = Memory(runner, self.requests, write, log_once)
        self.parking = Parking(runner, policy, self.requests, self.memory, write, log_once)
        self.admission = Admission(runner, self.requests, self.memory, self.parking, write, reuse)
        self.rounds = Rounds(runner, self.requests, self.memory, self.parking, self.admission, write,
                             self.inbox, self.control, limits)
        self.quitting = False  # QUIT: finish what runs, then exit
        self.ahead = AheadCaptures(runner)
        self.copies = AheadCopies(runner.pool, self.rounds.trace)

    def serve(self, stdin: TextIO) -> None:
        self.announce()
        self.inbox.start_reading(stdin, self.write)
        self.process()

    def announce(self) -> None:
        self.write(m.Info(self.runner.info()))
        self.write(m.Ready(self.runner.ctx, self.caps))

    @property
    def busy(self) -> bool:
        return self.requests.busy

    def process(self) -> None:
        """Rounds until QUIT (once what runs has finished) or the end of input. A round that runs out of the device's
        memory ends the process (OUT_OF_MEMORY, after an INFO of how many requests were in it): a step cut short has
        advanced some layers' states and not others, and the server continues its requests on a new engine that
        takes fewer at once."""
        while True:
            self.take_lines(block=not self.busy and not self.quitting)
            if self.inbox.gone or (self.quitting and not self.busy):
                return
            try:
                self.round()
            except Exception as e:
                if not out_of_memory(e):
                    raise
                held = self.requests.held()
                print(f"strata: out of memory in a step with {held} requests in the engine and "
                      f"{self.requests.settling()} answers read again ({e}; "
                      f"{self.runner.memory_report()}); ending, for the server to start the engine again with fewer",
                      file=sys.stderr, flush=True)
                self.write(m.Info({m.OUT_OF_MEMORY_RUNNING: str(held)}))
                raise SystemExit(m.OUT_OF_MEMORY) from None

    def take_lines(self, block: bool) -> None:
        """Handle the lines that arrived; with block, wait for one first (the engine is idle), doing the idle work
        (idle_work) while none comes."""
        while block and (work := self.idle_work()) is not None:
            self.inbox.take(self.control, block, IDLE_S)
            if self.busy or self.quitting or self.inbox.gone or not self.inbox.empty():
                return
            work()
        self.inbox.take(self.control, block)

    def idle_work(self) -> Callable[[], None] | None:
        """What an idle engine does next while no line comes: a decode graph captured ahead, else host-tier copies
        made ahead; None when neither is left."""
        if self.ahead.pending():
            return self.ahead.capture_one
        return self.copies.copy_some if self.copies.pending() else None

    def round(self) -> None:
        self.rounds.round()
        self.copies.beside_steps()

    def control(self, msg: m.Message) -> None:
        if isinstance(msg, m.Gen):
            self.rounds.trace.event("gen", id=msg.id, tokens=len(msg.tokens))
            self.admission.admit(msg)
        elif isinstance(msg, m.Quit):
            self.quitting = True
        elif isinstance(msg, m.Stop):
            for seq in [s for s in self.requests.seqs.values() if msg.id is None or s.id == msg.id]:
                self.stop(seq)
        elif isinstance(msg, m.Yield):
            self.parking.offer(msg.id)
        elif isinstance(msg, m.Resume):
            self.parking.resume(msg.id)
        elif isinstance(msg, m.Cancel):
            seq = self.requests.seqs.get(msg.id)
            if seq is None or not seq.parked:
                self.write(m.Err(f"no parked request with id {msg.id}", msg.id))
            else:
                self.admission.finish(seq, "cancel")
        else:
            self.write(m.Err(f"unexpected {verb(msg)} line for an engine", msg.id))

    def stop(self, seq: Sequence) -> None:
        """STOP: the request ends with `cancel` (after the PP of a chunk that has just run)."""
        if seq in self.requests.in_step:
            seq.finish = "cancel"
        else:
            self.admission.finish(seq, "cancel")


def engine_caps(policy: ParkPolicy) -> tuple[str, ...]:
    return ("stop", "preempt") if policy.enabled else ("stop",)


def run_loop(runner, policy: ParkPolicy, reuse: bool = True, limits: StepLimits = StepLimits()) -> None:
    EngineLoop(runner, policy, Writer(sys.stdout), engine_caps(policy), reuse, limits).serve(sys.stdin)
