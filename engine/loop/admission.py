"""Requests into the engine and out of it: a GEN checked and built into a Sequence, taken when
blocks for its first chunk can be had (after what the prefix cache gives it) or else answered DEFER
memory (the server keeps it queued); a request ended with DONE, or with ERR when nothing else can be
done for it, and everything it held given back."""
from __future__ import annotations

import time
from dataclasses import fields
from typing import Callable

import numpy as np

from protocol import messages as m

from engine.loop.memory import Memory
from engine.core.chunks import chunk_end
from engine.loop.parking import Parking
from engine.loop.request_table import RequestTable
from engine.kvcache.recurrent import SequenceState
from engine.runner.ngram_draft import NgramDrafter
from engine.runner.hidden_rows import readers
from engine.runner.pooling import SequencePool, embed_refusal
from engine.runner.prompt_scores import PromptScorer, scores_refusal
from engine.runner.sequence import Sequence
from engine.runner.sampler import Sampler, SamplingParams

_SAMPLING_KEYS = {f.name for f in fields(SamplingParams)}


class Admission:
    def __init__(self, runner, requests: RequestTable, memory: Memory, parking: Parking,
                 write: Callable[[m.Message], None], reuse: bool = True):
        self.runner, self.requests, self.memory, self.parking = runner, requests, memory, parking
        self.write, self.reuse = write, reuse
        self.pool = runner.pool

    def admit(self, gen: m.Gen) -> None:
        try:
            seq = self.build_sequence(gen)
        except ValueError as e:
            self.write(m.Err(str(e), gen.id))
            return
        if self.requests.held() >= self.runner.max_running:
            self.write(m.Defer("busy", gen.id))  # the server's cap is the engine's: it sent one too many
            return
        self.state_room()
        reuse = self.reuse and bool(gen.params.get("reuse", 1)) and all(r.reuses for r in readers(seq))
        if self.memory.paused or not self.place(seq, reuse=reuse):
            self.write(m.Defer("memory", gen.id))  # the server keeps it queued and sends it again
            return
        self.requests.add(seq)
        self.write(m.Info({"cached": str(seq.cached), "from_host": str(seq.from_host), "blocks": str(len(seq.table))},
                          seq.id))
        self.memory.report_pool()

    def build_sequence(self, gen: m.Gen) -> Sequence:
        if gen.id in self.requests.seqs:
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
        logprobs = gen.params.get("logprobs")
        if logprobs is not None and not 0 <= logprobs <= m.MAX_TOP_LOGPROBS:
            raise ValueError(f"logprobs={logprobs} must be within 0..{m.MAX_TOP_LOGPROBS}")
        embed = bool(gen.params.get("embed", 0))
        if embed and (refusal := embed_refusal(self.runner)):
            raise ValueError(refusal)
        scored = gen.params.get("prompt_logprobs")
        if scored is not None and not 0 <= scored <= m.MAX_TOP_LOGPROBS:
            raise ValueError(f"prompt_logprobs={scored} must be within 0..{m.MAX_TOP_LOGPROBS}")
        if scored is not None and (refusal := scores_refusal(self.runner)):
            raise ValueError(refusal)
        speculate = self.runner.draft_max and gen.params.get("spec", 1) and not embed
        read = gen.tokens[: len(gen.tokens) - drawn]  # a continuation's tokens so far go through as decode rows
        return Sequence(
            id=gen.id, prompt=read, max_new=drawn + min(gen.max_new, self.runner.ctx - len(gen.tokens)),
            sampler=Sampler(sampling, gen.tokens, drawn, constraint),
            stop_ids=self.runner.eos_ids | frozenset(sampling.stop),
            fingerprints=bool(gen.params.get("fp", 0)), drawn=drawn, replay=list(gen.tokens[len(read):]),
            session=gen.params.get("session"), logprobs=logprobs,
            drafter=self.drafter(read) if speculate else None,
            pool=SequencePool(self.runner.pooling, len(read), self.runner.backend.xp) if embed else None,
            scorer=PromptScorer(read, scored, self.runner.model) if scored is not None else None)

    def state_room(self) -> None:
        """A hybrid's requests and its answers read again each hold two recurrent states, in the room the memory
        plan set aside for --max-running requests' (engine/kvcache/state_memory.py): a new request takes the
        newest answer's read again where it needs its room; one in the step whose lines these are is let go
        once that step is done (before the new request's first read makes its states)."""
        while self.states_full():
            settling = self.memory.droppable_settling()
            in_step = [s for s in self.requests.in_step if s.settling and s not in self.memory.let_go]
            if settling:
                self.memory.drop_settling(settling[-1])
            elif in_step:
                self.memory.let_go.append(in_step[-1])
            else:
                return

    def states_full(self) -> bool:
        """A hybrid's running requests and answers read again (less those let go at the end of this step) hold all
        the room for recurrent states the memory plan set aside (--max-running requests'); never for other models."""
        if self.runner.recurrent is None:
            return False
        taken = self.requests.held() + self.requests.settling() - len(self.memory.let_go)
        return taken >= self.runner.max_running

    def drafter(self, prompt: tuple[int, ...]):
        """A request's drafter: the draft model's (engine/runner/draft_model.py), else the n-gram one."""
        if self.runner.draft_model is not None:
            return self.runner.draft_model.drafter(prompt, self.runner.draft_max)
        return NgramDrafter(prompt, self.runner.draft_max, self.runner.escapes)

    def place(self, seq: Sequence, reuse: bool) -> bool:
        """Blocks for `seq` up to the end of its first chunk: a cached prefix first (whole blocks when
        rows are the same in any step, else rounded down to a chunk boundary; short of the prompt's
        last token), then new ones, moving parked reads out if need be. False (nothing held) if they
        cannot be had."""
        chunk, size = self.runner.chunk, self.pool.size
        if reuse:
            unit = size if self.runner.shape_free else chunk
            limit = (seq.total - 1) // unit * unit
            loaded = self.pool.tier.loaded if self.pool.tier is not None else 0
            self.memory.free_settling(self.pool.blocks_for(seq.total + 1))  # the host tier's blocks need room
            seq.table = self.pool.lookup(seq.prompt, limit, align=unit // size)
            if self.runner.state_cache is not None:  # a hybrid: only as far as a recurrent state is kept
                self.resume_state(seq)
            seq.pos = seq.cached = len(seq.table) * size
            if self.pool.tier is not None:
                seq.from_host = (self.pool.tier.loaded - loaded) * size
        if self.memory.get_blocks(seq, chunk_end(seq.pos, seq.total, chunk), pause_others=False):
            return True
        self.memory.end(seq)  # (and a hybrid's state at its cached prefix)
        seq.pos = seq.cached = seq.from_host = 0
        return False

    def resume_state(self, seq: Sequence) -> None:
        """A hybrid's cached prefix cut back to the last block after which its recurrent state is kept
        (engine/kvcache/state_cache.py), seq's state that one; none kept: no prefix."""
        blocks, state = self.runner.state_cache.resume([self.pool.blocks[i].key for i in seq.table])
        self.pool.release(seq.table[blocks:])  # (release empties the list it is given)
        del seq.table[blocks:]
        seq.state = (SequenceState.at(state, blocks * self.pool.size, self.runner.backend.xp) if state is not None
                     else None)

    # ------------------------------------------------------------ out

    def embedded(self, seq: Sequence) -> None:
        """An embed request's prompt is read: its pooled hidden state (engine/runner/pooling.py) as an EMB
        line, then its DONE (no token drawn)."""
        vector = self.runner.backend.to_host(seq.pool.vector).astype(np.float32)  # (dim,)
        self.write(m.Embedding(tuple(vector.tolist()), seq.id))
        self.finish(seq, "stop")

    def finish(self, seq: Sequence, reason: str) -> None:
        """DONE: the request ends (stop, length, cancel); its blocks, snapshots and reservation go back."""
        seq.finish = reason
        if seq.decode_started is not None:
            seq.decode_ms = (time.perf_counter() - seq.decode_started) * 1000
        extra = {"parks": str(seq.parks), "park_ms": f"{seq.park_ms:.3f}", "cached": str(seq.cached),
                 "shared_ms": f"{seq.shared_ms:.3f}"}
        if seq.drafter is not None:  # speculative decoding: tokens drafted and accepted; its draft rows let go
            extra |= {"drafted": str(seq.drafter.drafted), "accepted": str(seq.drafter.accepted)}
            seq.drafter.release()
        if seq.fingerprints and (seq.table or not seq.kv_len):
            extra["fp"] = self.runner.fingerprint(seq)
        new = max(0, len(seq.generated) - seq.drawn)  # (a continuation's tokens after those it had; none if it
        # ended, a cancel, before they were through again)
        self.write(m.Done(new, seq.total + seq.drawn, seq.prompt_ms, seq.decode_ms, reason, extra, seq.id))
        self.requests.remove(seq)
        self.memory.forget(seq)
        self.parking.forget(seq)
        if self.settles(seq, reason):
            self.requests.settle(seq)
            return
        self.memory.end(seq)
        self.memory.report_pool()

    def settles(self, seq: Sequence, reason: str) -> bool:
        """Where rows do not depend on the step, an answer's rows are read again as prompt rows once
        its DONE is out (its decode rows were made by the decode path, whose bits differ), so that its
        whole blocks can be registered: an agent's next turn, its prompt this one's plus the answer,
        then reuses the answer too, with the tokens a cold read would give. The read goes last in line
        (it takes what the steps leave), its blocks are given back when it is done, and it is the first
        thing dropped when memory runs short. seq becomes that read: its prompt grown by the answer's
        tokens up to the last block they fill (only whole blocks are shared; the newest token's row
        was never written); none if they fill none. A hybrid's read again holds two recurrent states: only
        while the running requests leave room for them (state_room)."""
        upto = (seq.total + len(seq.generated) - 1) // self.pool.size * self.pool.size
        if not (self.reuse and self.runner.shape_free and reason in ("stop", "length") and seq.table
                and not seq.paused and upto > seq.total):
            return False
        if self.states_full():
            return False
        seq.prompt = seq.prompt + tuple(seq.generated[: upto - seq.total])
        seq.settling = True
        return True

    def drop(self, seq: Sequence, message: str) -> None:
        """End a request with an ERR (nothing else can be done for it); its blocks go back."""
        self.write(m.Err(message, seq.id))
        self.requests.remove(seq)
        self.memory.end(seq)
