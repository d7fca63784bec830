"""KV blocks under pressure: every chunk and decode step first gets the blocks it writes.

Memory is one pool of KV blocks (engine/kvcache/block_pool.py). When none are free, in this order:
unreferenced cached blocks are evicted (the pool does it), parked reads move to host memory (oldest
park first), then the newest other request holding blocks is paused into host memory, to be brought
back first (before any new GEN is taken) and bit-exact: its rows are copied back, not recomputed.
The oldest request can therefore always go on, and one request always fits (the context is at most
the pool). If moving a parked read out fails, its rows are dropped and it reads again from its start
when resumed (the same tokens: chunks are absolute).
"""
from __future__ import annotations

import time
from typing import Callable

from protocol import messages as m

from engine.core.chunks import chunk_end
from engine.loop.request_table import RequestTable
from engine.ops.expert_cache import cache_report
from engine.runner.sequence import Sequence


def timed_copy(seq: Sequence, copy, *args):
    """A snapshot copy (out or back in); its time is the park's cost, reported in DONE."""
    started = time.perf_counter()
    result = copy(seq, *args)
    seq.park_ms += (time.perf_counter() - started) * 1000
    return result


class Memory:
    def __init__(self, runner, requests: RequestTable, write: Callable[[m.Message], None],
                 log_once: Callable[[str, str], None]):
        self.runner, self.requests, self.write, self.log_once = runner, requests, write, log_once
        self.pool = runner.pool  # engine/kvcache/block_pool.py BlockPool: every request's KV blocks
        self.snapshots: dict[int, object] = {}  # spilled parked reads' rows (None: dropped, read again)
        self.paused: list[Sequence] = []  # moved to host memory under pressure, brought back first
        self.pause_snapshots: dict[int, object] = {}
        self.pauses_total = 0
        self.experts = runner.expert_caches  # routed experts behind a cache (engine/ops/expert_cache.py): reported
        self.reported = 0.0  # when the pool was last reported (time.monotonic)
        self.let_go: list[Sequence] = []  # answers read again in the step now ending, dropped once it is done

    def get_blocks(self, seq: Sequence, positions: int, pause_others: bool = True) -> bool:
        """Grow seq's table to cover `positions`: evicting cached blocks, then moving parked reads
        out, then (pause_others) pausing the newest requests newer than seq that hold blocks. False
        if that does not free enough (seq's table unchanged): seq is then the newest that needs
        room, and the caller pauses it (or, for a GEN, defers it)."""
        while not self.pool.can_grow(seq.table, positions):
            settling = self.droppable_settling(but=seq)
            if settling:  # an answer read again for sharing: worth least
                self.drop_settling(settling[-1])
                continue
            parked = [s for s in self.requests.seqs.values() if s.parked and s.table and s is not seq]
            if parked:
                self.move_out(min(parked, key=lambda s: s.parked_seq))
                continue
            newer = self.requests.newer(seq)
            in_step = self.requests.in_step
            victims = [s for s in newer if s.table and not s.parked and s not in in_step] if pause_others else []
            if not victims:
                return False
            self.pause(victims[-1])
        self.pool.grow(seq.table, positions)
        return True

    def grow_from_free(self, seq: Sequence, positions: int) -> bool:
        """seq's table grown to cover `positions` from free blocks alone (no cached block evicted, nobody
        moved or paused); False, the table unchanged, if there are too few."""
        if self.pool.blocks_for(positions) - len(seq.table) > len(self.pool.free):
            return False
        self.pool.grow(seq.table, positions)
        return True

    def droppable_settling(self, but: Sequence | None = None) -> list[Sequence]:
        """The answers read again that may be let go (not one whose step writes its rows now), oldest first."""
        return [s for s in self.requests.line if s.settling and s is not but and s not in self.requests.in_step]

    def free_settling(self, blocks: int) -> None:
        """Answers read again let go, newest first, until `blocks` blocks are available (or none is
        left): a new request's prefix lookup counts only what is available."""
        while self.pool.available < blocks:
            settling = self.droppable_settling()
            if not settling:
                return
            self.drop_settling(settling[-1])

    def drop_settling(self, seq: Sequence) -> None:
        """A finished request's answer, read again for sharing, is let go (what is registered stays); the
        pool's state goes to the server (its DONE reported the blocks still held)."""
        self.requests.line.remove(seq)
        self.end(seq)
        self.report_pool()

    def drop_let_go(self) -> None:
        """The answers read again that a new request took the room of (Admission.state_room), once their step is
        done."""
        for seq in self.let_go:
            if seq in self.requests.line:
                self.drop_settling(seq)
        self.let_go.clear()

    def end(self, seq: Sequence) -> None:
        """A request, or an answer read again, done with: its blocks back (release) and a hybrid's two recurrent
        states back to their pool now, not once the last reference to seq goes: at 256 clients the states of
        requests ended in a step outlived it beside their successors', past the room the memory plan made
        (engine/kvcache/state_memory.py)."""
        self.release(seq)
        seq.state = None

    def release(self, seq: Sequence) -> None:
        """seq's blocks back to the pool (a session's stay cached longer), and its rows in a draft model's
        pool (engine/runner/draft_model.py: read again at its next draft)."""
        self.pool.release(seq.table, kept=seq.session is not None)
        if seq.drafter is not None:
            seq.drafter.release()

    # ------------------------------------------------------------ parked reads out and back in

    def move_out(self, seq: Sequence) -> None:
        """A parked read's rows to host memory (within the budget its park reserved); its blocks go
        back to the pool (its whole chunks stay cached while nobody needs the room)."""
        try:
            self.snapshots[seq.id] = timed_copy(seq, self.runner.spill)
        except Exception as e:  # MemoryError, CuPy's OutOfMemoryError, ...: it will read again
            self.log_once("snapshot_failed", f"moving a parked read out failed ({type(e).__name__}: {e}); "
                                             "it will read its prompt again when resumed")
            self.write(m.Decline("snapshot_failed", seq.pos, seq.total, seq.id))
            self.snapshots[seq.id] = None
        self.release(seq)
        self.write(m.Info({"host": "1"}, seq.id))  # in host memory now

    def moved_out(self, seq: Sequence) -> bool:
        return seq.id in self.snapshots

    def move_in(self, seq: Sequence) -> bool:
        """A moved-out parked read back into blocks of the pool, its rows copied back (or, dropped,
        its read starting again: the same chunks). False if the blocks cannot be had now."""
        snap = self.snapshots[seq.id]
        rows = 0 if snap is None else seq.pos
        if self.paused or not self.get_blocks(seq, max(rows, chunk_end(rows, seq.total, self.runner.chunk)),
                                              pause_others=False):
            return False
        del self.snapshots[seq.id]
        if snap is None:
            seq.pos = 0  # its rows were dropped: the read starts again (the same chunks)
        else:
            timed_copy(seq, self.runner.restore, snap)
        self.write(m.Info({"host": "0"}, seq.id))
        return True

    # ------------------------------------------------------------ running requests paused and brought back

    def pause(self, seq: Sequence) -> None:
        """Memory pressure: a running request's rows to host memory and its blocks to the pool; it
        comes back first, its rows copied back (bit-exact: nothing is recomputed)."""
        self.pause_snapshots[seq.id] = timed_copy(seq, self.runner.spill)
        self.runner.set_aside(seq)  # logits not yet drawn from (a decoder paused between its steps)
        self.release(seq)
        seq.paused = True
        self.paused.append(seq)
        self.pauses_total += 1
        self.log_once("paused", "KV memory is full: pausing the newest request into host memory "
                                "(it resumes first, unchanged)")
        self.write(m.Info({"paused": "1"}, seq.id))

    def bring_back(self) -> None:
        """Paused requests back into the pool, in the order they were paused, while blocks allow
        (parked reads move out for them: otherwise a paused request waiting behind a parked read
        would wait for a RESUME the server cannot send while the engine defers everything)."""
        while self.paused:
            seq = self.paused[0]  # room for its rows and for what it does next (its next chunk, or a step)
            need = chunk_end(seq.pos, seq.total, self.runner.chunk) if seq.reading else seq.rows + 1
            if not self.get_blocks(seq, max(need, 1), pause_others=False):
                return
            timed_copy(seq, self.runner.restore, self.pause_snapshots.pop(seq.id))
            seq.paused = False
            self.paused.pop(0)
            self.write(m.Info({"paused": "0"}, seq.id))

    def forget(self, seq: Sequence) -> None:
        """A finished request: its snapshots dropped, and its place among the paused."""
        self.snapshots.pop(seq.id, None)
        self.pause_snapshots.pop(seq.id, None)
        if seq in self.paused:
            self.paused.remove(seq)

    def report_pool(self) -> None:
        """The pool's state for the server's /status and /metrics (an INFO line without an id)."""
        pool = self.pool
        fields = {"used": pool.used, "cached": len(pool.cached), "free": len(pool.free), "idle": len(pool.idle),
                  "kept": len(pool.kept),
                  "evictions": pool.evictions, "paused": len(self.paused), "pauses": self.pauses_total}
        if pool.tier is not None:
            fields |= pool.tier.status()
        if self.runner.draft_model is not None:  # a draft model's own pool (engine/runner/draft_model.py)
            fields |= {"draft_free": len(self.runner.draft_model.free)}
        if self.experts:  # the expert cache's counts (engine/ops/expert_cache.py)
            fields |= cache_report(self.experts)
        self.write(m.Info({f"pool_{k}": str(v) for k, v in fields.items()}))
        self.reported = time.monotonic()

    def report_now_and_then(self, every_s: float = 1.0) -> None:
        """With an expert cache, whose counts move every step, the pool's report about every `every_s` while
        requests run (for the live view and /metrics), beside those at each request's start and end."""
        if self.experts and time.monotonic() - self.reported >= every_s:
            self.report_pool()
