"""Parks: a read offered a boundary (YIELD) parks at its next chunk boundary if the gates pass
(engine/loop/park_policy.py), and reads on from there when resumed (RESUME).

Parks stay in place: a parked read keeps its blocks at no cost, and its whole chunks stay shareable.
The park gates reserve room in the one snapshot budget for every parked read, so a move out (under
memory pressure, engine/loop/memory.py) never exceeds it.
"""
from __future__ import annotations

import itertools
from typing import Callable

from protocol import messages as m

from engine.loop.memory import Memory
from engine.loop.park_policy import ParkPolicy
from engine.loop.request_table import RequestTable
from engine.runner.sequence import Sequence


class Parking:
    def __init__(self, runner, policy: ParkPolicy, requests: RequestTable, memory: Memory,
                 write: Callable[[m.Message], None], log_once: Callable[[str, str], None]):
        self.runner, self.policy, self.requests, self.memory = runner, policy, requests, memory
        self.write, self.log_once = write, log_once
        self.reserved: dict[int, int] = {}  # parked reads' snapshot sizes, held in the budget
        self.park_ticks = itertools.count(1)

    def offer(self, ident: int | None) -> None:
        """YIELD: the named read (or the first in line) parks at its next chunk boundary."""
        line = [s for s in self.requests.line if not s.settling]  # (an answer read again is no request's)
        target = self.requests.seqs.get(ident) if ident is not None else (line[0] if line else None)
        if target is not None and target.reading and not target.parked:
            target.yield_wanted = True  # honoured at its next chunk boundary; decode never parks

    def try_park(self, seq: Sequence) -> None:
        """At a chunk boundary after an offer: SUSPENDED if the gates pass, else DECLINE."""
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
        self.requests.line.remove(seq)
        self.write_fingerprint(seq, "park")
        self.write(m.Suspended(seq.pos, seq.total, seq.id))

    def resume(self, ident: int) -> None:
        """RESUME: the parked read back in line (its rows back from host memory first if they moved
        out; DEFER memory, still parked, if they cannot come back now)."""
        seq = self.requests.seqs.get(ident)
        if seq is None or not seq.parked:
            self.write(m.Err(f"no parked request with id {ident}", ident))
            return
        if self.memory.moved_out(seq) and not self.memory.move_in(seq):
            self.write(m.Defer("memory", ident))  # it stays parked; the server asks again later
            return
        seq.parked = False
        self.reserved.pop(seq.id, None)
        self.write_fingerprint(seq, "resume")
        self.requests.line.append(seq)

    def forget(self, seq: Sequence) -> None:
        """A finished request's reservation back to the budget."""
        self.reserved.pop(seq.id, None)

    def write_fingerprint(self, seq: Sequence, stage: str) -> None:
        if seq.fingerprints:
            self.write(m.Fingerprint(stage, seq.pos, self.runner.fingerprint(seq), seq.id))
