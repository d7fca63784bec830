"""The engine's protocol loop: a stdin thread feeds an inbox; the requests in the engine advance
in rounds.

A round is one decode step for every decoding request together (one pass over the weights), then
prompt chunks of the reads in line (the first one's, then the next one's) while the decoders have
waited less than `interval_ms` (at least one chunk), so that a long read never stops the others
from decoding, reads get the time the interval allows, and a read's chunks stay at absolute
boundaries. A request's first token is drawn right after its last chunk. A chunk deep in a long read takes longer
than a decoding client should wait for its next token, so it pauses between layers for further
decode steps, about every `interval_ms` (the layers per pause estimated from the read's last
chunk); the pauses change neither the chunk's arithmetic nor its boundaries. Control lines (GEN,
STOP, YIELD, RESUME, CANCEL) are taken between rounds and after each chunk, before its PP.

Memory is one pool of KV blocks (engine/kvcache/block_pool.py). A GEN is taken when blocks for its first chunk
can be had (after what the prefix cache gives it); otherwise it is answered DEFER memory and the
server keeps it queued. Every chunk and decode step first gets the blocks it writes; when none are
free, in this order: unreferenced cached blocks are evicted (the pool does it), parked reads move
to host memory (oldest park first), then the newest other request holding blocks is paused into
host memory, to be brought back first (before any new GEN is taken) and bit-exact: its rows are
copied back, not recomputed. The oldest request can therefore always go on, and one request always
fits (the context is at most the pool).

Parks stay in place: a parked read keeps its blocks at no cost, and its whole chunks stay shareable.
The park gates reserve room in the one snapshot budget for every parked read, so a move out never
exceeds it; if the copy itself fails, the read's rows are dropped and it reads again from its
start when resumed (the same tokens: chunks are absolute).
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

from engine.runner.grammar_mask import GrammarError
from engine.loop.park_policy import ParkPolicy, chunk_end
from engine.runner.sampler import Sampler, SamplingParams
from engine.loop.sequence import Sequence

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
        self.pool = runner.pool  # engine/kvcache/block_pool.py BlockPool: every request's KV blocks
        self.seqs: dict[int | None, Sequence] = {}  # every request in the engine, by id, in arrival order
        self.line: list[Sequence] = []  # reads in order: the first one reads the next chunk
        self.snapshots: dict[int, object] = {}  # spilled parked reads' rows (None: dropped, read again)
        self.paused: list[Sequence] = []  # moved to host memory under pressure, brought back first
        self.pause_snapshots: dict[int, object] = {}
        self.pauses_total = 0
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
        held = sum(1 for s in self.seqs.values() if not s.parked)
        if held >= self.runner.max_running:
            self.write(m.Defer("busy", gen.id))  # the server's cap is the engine's: it sent one too many
            return
        if self.paused or not self.place(seq, reuse=self.reuse and bool(gen.params.get("reuse", 1))):
            self.write(m.Defer("memory", gen.id))  # the server keeps it queued and sends it again
            return
        self.seqs[seq.id] = seq
        self.line.append(seq)
        self.write(m.Info({"cached": str(seq.cached), "from_host": str(seq.from_host), "blocks": str(len(seq.table))},
                          seq.id))
        self.report_pool()

    def report_pool(self) -> None:
        """The pool's state for the server's /status and /metrics (an INFO line without an id)."""
        pool = self.pool
        fields = {"used": pool.used, "cached": len(pool.cached), "free": len(pool.free), "idle": len(pool.idle),
                  "kept": len(pool.kept),
                  "evictions": pool.evictions, "paused": len(self.paused), "pauses": self.pauses_total}
        if pool.tier is not None:
            fields |= pool.tier.status()
        self.write(m.Info({f"pool_{k}": str(v) for k, v in fields.items()}))

    def place(self, seq: Sequence, reuse: bool) -> bool:
        """Blocks for `seq` up to the end of its first chunk: a cached prefix first (rounded down to
        a chunk boundary, short of the prompt's last token), then new ones, moving parked reads out
        if need be. False (nothing held) if they cannot be had."""
        chunk, size = self.runner.chunk, self.pool.size
        if reuse:
            limit = (seq.total - 1) // chunk * chunk
            loaded = self.pool.tier.loaded if self.pool.tier is not None else 0
            seq.table = self.pool.lookup(seq.prompt, limit, align=chunk // size)
            seq.pos = seq.cached = len(seq.table) * size
            if self.pool.tier is not None:
                seq.from_host = (self.pool.tier.loaded - loaded) * size
        if self.get_blocks(seq, chunk_end(seq.pos, seq.total, chunk), pause_others=False):
            return True
        self.pool.release(seq.table, kept=seq.session is not None)
        seq.pos = seq.cached = seq.from_host = 0
        return False

    def get_blocks(self, seq: Sequence, positions: int, pause_others: bool = True) -> bool:
        """Grow seq's table to cover `positions`: evicting cached blocks, then moving parked reads
        out, then (pause_others) pausing the newest requests newer than seq that hold blocks. False
        if that does not free enough (seq's table unchanged): seq is then the newest that needs
        room, and the caller pauses it (or, for a GEN, defers it)."""
        while not self.pool.can_grow(seq.table, positions):
            parked = [s for s in self.seqs.values() if s.parked and s.table and s is not seq]
            if parked:
                self.move_out(min(parked, key=lambda s: s.parked_seq))
                continue
            order = list(self.seqs.values())  # arrival order
            newer = order[order.index(seq) + 1 :] if seq in order else []
            victims = [s for s in newer if s.table and not s.parked and s is not self.in_chunk] if pause_others else []
            if not victims:
                return False
            self.pause(victims[-1])
        self.pool.grow(seq.table, positions)
        return True

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
            fingerprints=bool(gen.params.get("fp", 0)), drawn=drawn, session=gen.params.get("session"))

    # ------------------------------------------------------------ rounds

    def round(self) -> None:
        self.bring_back()
        decoding = [s for s in self.seqs.values() if s.decoding]
        if decoding:
            started = time.perf_counter()
            self.decode_step(decoding)
            if self.line:  # the read in front waited for it
                self.line[0].shared_ms += (time.perf_counter() - started) * 1000
            self.take_lines(block=False)
        started, reader = time.perf_counter(), self.next_reader()
        while reader is not None and self.read_next(reader) and not self.gone:
            reader = self.next_reader()
            if reader is None or not any(s.decoding for s in self.seqs.values()):
                break  # nobody waits for a step: the next round reads on (taking control lines first)
            if (time.perf_counter() - started) * 1000 + (reader.chunk_ms or self.chunk_ms or 0.0) > self.interval_ms:
                break  # the decoders have waited about interval_ms: their step comes first

    def next_reader(self) -> Sequence | None:
        """The first read in line that is not paused: it reads the next chunk."""
        return next((s for s in self.line if not s.paused), None)

    def read_next(self, reader: Sequence) -> bool:
        """One prompt chunk of `reader` (its blocks had first); False if it could not be read."""
        if self.get_blocks(reader, chunk_end(reader.pos, reader.total, self.runner.chunk)):
            self.read_chunk(reader)
            return True
        if any(s.table for s in self.seqs.values() if s is not reader) or self.paused:
            self.pause(reader)  # the newest needing room gives its own up, so that older ones go on
        else:  # alone and still short of room: the pool is smaller than one request (a bug, not a wait)
            self.drop(reader, f"the KV pool ({self.pool.total} blocks of {self.pool.size}) cannot hold "
                              f"this request's next chunk")
        return False

    def drop(self, seq: Sequence, message: str) -> None:
        """End a request with an ERR (nothing else can be done for it); its blocks go back."""
        self.write(m.Err(message, seq.id))
        self.seqs.pop(seq.id, None)
        if seq in self.line:
            self.line.remove(seq)
        self.pool.release(seq.table, kept=seq.session is not None)

    def decode_step(self, seqs: list[Sequence]) -> None:
        """Each decoding request's next token from its logits, then one batched forward for those
        that go on (each with a block for its new row; a request that cannot have one is paused)."""
        going = []
        now = time.perf_counter()
        for seq in seqs:
            if seq.paused:  # paused by an earlier row's need in this step
                continue
            # (a request whose token is drawn and not yet through the model, unstepped: its first, drawn
            # right after its prompt, or one paused after its draw, goes straight to its forward)
            if seq.unstepped or self.draw(seq, now):
                going.append(seq)
        for seq in list(going):  # oldest first: a newer one gives its blocks up first
            if not seq.paused and not self.get_blocks(seq, seq.kv_len + 1):
                self.pause(seq)
        going = [s for s in going if not s.paused]
        for batch in range(0, len(going), self.runner.max_batch):
            rows = going[batch : batch + self.runner.max_batch]
            self.runner.decode_batch(rows)
            for seq in rows:
                seq.unstepped = False
                if batch + self.runner.max_batch < len(going):  # the next batch's replay reuses the buffers
                    self.runner.set_aside(seq)

    def draw(self, seq: Sequence, now: float) -> bool:
        """The request's next token from its logits, written out; False if that ends it."""
        if seq.decode_started is None:
            seq.decode_started = now
        token = self.runner.sample(seq)
        try:
            seq.sampler.accept(token)
        except GrammarError as e:
            self.drop(seq, f"constrained decoding failed: {e}")
            return False
        seq.generated.append(token)
        self.write(m.T(token, seq.id))
        if token in seq.stop_ids:
            self.finish(seq, "stop")
            return False
        if len(seq.generated) >= seq.max_new:
            self.finish(seq, "length")
            return False
        seq.unstepped = True
        return True

    def read_chunk(self, seq: Sequence) -> None:
        started = time.perf_counter()
        before = seq.pos
        self.in_chunk, self.paused_ms = seq, 0.0
        self.runner.read_prompt_chunk(seq, self.pauses(seq))
        ms = (time.perf_counter() - started) * 1000  # PP reports the wall time, pauses included
        self.chunk_ms = seq.chunk_ms = ms - self.paused_ms
        seq.prompt_ms += seq.chunk_ms
        seq.shared_ms += self.paused_ms
        chunk = self.runner.chunk
        self.pool.register(seq.table, seq.prompt, seq.pos // chunk * chunk)  # its whole chunks, shareable now
        self.take_lines(block=False)  # lines that arrived during this chunk, before its PP
        self.in_chunk = None
        self.write(m.PP(seq.pos, seq.total, ms, (seq.pos - before) / max(ms, 1e-6) * 1000, seq.id))
        if seq.finish is not None:  # a STOP came during the chunk
            self.finish(seq, seq.finish)
        elif not seq.reading:
            self.line.remove(seq)
            seq.yield_wanted = False  # decode never parks
            self.draw(seq, time.perf_counter())  # its first token now, not after the next decode step
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
        if seq.fingerprints and (seq.table or not seq.kv_len):
            extra["fp"] = self.runner.fingerprint(seq)
        self.write(m.Done(len(seq.generated), seq.total, seq.prompt_ms, seq.decode_ms, reason, extra, seq.id))
        self.seqs.pop(seq.id, None)
        if seq in self.line:
            self.line.remove(seq)
        self.snapshots.pop(seq.id, None)
        self.pause_snapshots.pop(seq.id, None)
        if seq in self.paused:
            self.paused.remove(seq)
        self.reserved.pop(seq.id, None)
        self.pool.release(seq.table, kept=seq.session is not None)
        self.report_pool()

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

    def move_out(self, seq: Sequence) -> None:
        """A parked read's rows to host memory (within the budget its park reserved); its blocks go
        back to the pool (its whole chunks stay cached while nobody needs the room)."""
        try:
            self.snapshots[seq.id] = self.timed_copy(seq, self.runner.spill)
        except Exception as e:  # MemoryError, CuPy's OutOfMemoryError, ...: it will read again
            self.log_once("snapshot_failed", f"moving a parked read out failed ({type(e).__name__}: {e}); "
                                             "it will read its prompt again when resumed")
            self.write(m.Decline("snapshot_failed", seq.pos, seq.total, seq.id))
            self.snapshots[seq.id] = None
        self.pool.release(seq.table, kept=seq.session is not None)
        self.write(m.Info({"host": "1"}, seq.id))  # in host memory now

    def pause(self, seq: Sequence) -> None:
        """Memory pressure: a running request's rows to host memory and its blocks to the pool; it
        comes back first, its rows copied back (bit-exact: nothing is recomputed)."""
        self.pause_snapshots[seq.id] = self.timed_copy(seq, self.runner.spill)
        self.runner.set_aside(seq)  # logits not yet drawn from (a decoder paused between its steps)
        self.pool.release(seq.table, kept=seq.session is not None)
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
            self.timed_copy(seq, self.runner.restore, self.pause_snapshots.pop(seq.id))
            seq.paused = False
            self.paused.pop(0)
            self.write(m.Info({"paused": "0"}, seq.id))

    def resume(self, ident: int) -> None:
        seq = self.seqs.get(ident)
        if seq is None or not seq.parked:
            self.write(m.Err(f"no parked request with id {ident}", ident))
            return
        if seq.id in self.snapshots:  # moved out: back into blocks of the pool
            snap = self.snapshots[seq.id]
            rows = 0 if snap is None else seq.pos
            if self.paused or not self.get_blocks(seq, max(rows, chunk_end(rows, seq.total, self.runner.chunk)),
                                                  pause_others=False):
                self.write(m.Defer("memory", ident))  # it stays parked; the server asks again later
                return
            del self.snapshots[seq.id]
            if snap is None:
                seq.pos = 0  # its rows were dropped: the read starts again (the same chunks)
            else:
                self.timed_copy(seq, self.runner.restore, snap)
            self.write(m.Info({"host": "0"}, ident))
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
