"""The requests in the engine: every one by id in arrival order, the reads in line, the read whose
chunk is running. A table the loop's parts share; each request's own state is its Sequence."""
from __future__ import annotations

from engine.runner.sequence import Sequence


class RequestTable:
    def __init__(self):
        self.seqs: dict[int | None, Sequence] = {}  # every request in the engine, by id, in arrival order
        self.line: list[Sequence] = []  # reads in order: the first one reads the next chunk
        self.in_step: list[Sequence] = []  # the reads whose chunks run or have run and whose PPs are not out yet

    def add(self, seq: Sequence) -> None:
        """A new request: last in arrival order and last in line."""
        self.seqs[seq.id] = seq
        self.line.append(seq)

    def remove(self, seq: Sequence) -> None:
        self.seqs.pop(seq.id, None)
        if seq in self.line:
            self.line.remove(seq)

    def settle(self, seq: Sequence) -> None:
        """A finished request whose answer is read again (engine/loop/admission.py, settles): last in line,
        no longer among the requests (its id is free, it holds no place)."""
        self.seqs.pop(seq.id, None)
        self.line.append(seq)

    @property
    def busy(self) -> bool:
        """Some request reads or decodes (parked ones wait for a RESUME), or an answer is read again."""
        return any(not s.parked for s in self.seqs.values()) or any(s.settling for s in self.line)

    def held(self) -> int:
        """Requests that hold a place in the engine (reading, decoding or paused; not parked)."""
        return sum(1 for s in self.seqs.values() if not s.parked)

    def settling(self) -> int:
        """Answers read again (engine/loop/admission.py settles) in line."""
        return sum(1 for s in self.line if s.settling)

    def decoding(self) -> list[Sequence]:
        return [s for s in self.seqs.values() if s.decoding]

    def any_decoding(self) -> bool:
        return any(s.decoding for s in self.seqs.values())

    def next_reader(self) -> Sequence | None:
        """The first of readers(): it reads the next chunk."""
        readers = self.readers()
        return readers[0] if readers else None

    def readers(self) -> list[Sequence]:
        """The reads in line that are not paused, in line order, the answers read again after every
        request's (they take what the steps leave, and never move a request's chunks)."""
        return sorted((s for s in self.line if not s.paused), key=lambda s: s.settling)

    def newer(self, seq: Sequence) -> list[Sequence]:
        """The requests that arrived after `seq`, oldest first (none if seq is not in the engine)."""
        order = list(self.seqs.values())  # arrival order
        return order[order.index(seq) + 1 :] if seq in order else []
