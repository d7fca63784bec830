"""A decode step: each decoding request's next token drawn from its logits, then one batched forward for
those that go on (engine/loop/rounds.py runs it once a round, and in a long read's pauses). With
speculative decoding (drafters: engine/runner/ngram_draft.py, engine/runner/draft_model.py) a request's
drafted tokens go through the same forward as rows after its newest token, each a decode row like any
other; a draft is kept while the token drawn from the row before it is the draft itself, so the tokens
are those one-token steps give, whatever the drafts.

Sampled requests draft too. The draw from each row takes the request's next uniform exactly as a
one-token step would, so a seeded answer is the same token for token. For a drafter that proposes
one token (not a distribution) this is the standard acceptance rule: the draft d is kept with
probability p(d), and a rejected row's token follows p without d, renormalised, which is
(p - q)+ for q = one-hot(d); the output distribution is the model's."""
from __future__ import annotations

import time
from typing import Callable

from protocol import messages as m

from engine.loop.admission import Admission
from engine.loop.memory import Memory
from engine.loop.step_trace import StepTrace
from engine.runner.grammar_drafts import allowed_drafts, forced_drafts
from engine.runner.grammar_mask import GrammarError
from engine.runner.sequence import Sequence

FREE_ROW_KEYS = 4096  # the longest context whose spare graph rows carry drafts (fill_spare_rows)


class DecodeSteps:
    def __init__(self, runner, memory: Memory, admission: Admission, write: Callable[[m.Message], None],
                 trace: StepTrace):
        self.runner, self.memory, self.admission, self.write, self.trace = runner, memory, admission, write, trace
        self.row_cost = runner.row_cost  # what a drafted row costs (speculative decoding's pace), measured here

    def step(self, seqs: list[Sequence]) -> None:
        """Each decoding request's next token from its logits, then one batched forward for those
        that go on (each with a block for its new row; a request that cannot have one is paused). Where the
        device runs the forward while the host goes on (runner.runs_async) and nothing drafts, the token lines of
        the requests that go on are written meanwhile (a request's lines stay in order: its next token comes
        after the forward; one that ends has its last line and DONE at once, its blocks let go before the others'
        are had, as before)."""
        going, held = [], ([] if self.runner.runs_async and self.runner.draft_max == 0 else None)
        now = began = time.perf_counter()
        self.runner.pick_ahead([s for s in seqs if not s.paused and not s.unstepped])  # (the GPU's plain draws at once)
        picked = time.perf_counter()
        for seq in seqs:
            if seq.paused:  # paused by an earlier row's need in this step
                continue
            # (a request whose token is drawn and not yet through the model, unstepped: its first, drawn
            # right after its prompt, or one paused after its draw, goes straight to its forward)
            if seq.unstepped or self.draw(seq, now, held):
                going.append(seq)
        drawn = time.perf_counter()
        for seq in list(going):  # oldest first: a newer one gives its blocks up first
            if not seq.paused and not self.memory.get_blocks(seq, seq.kv_len + 1):
                self.memory.pause(seq)
        going = [s for s in going if not s.paused]
        if self.trace.enabled:  # (the host's work between two decode steps: the draws at once, then each row's
            # token and line, then the rows' blocks)
            self.trace.step("draws", began, rows=len(seqs), picks_ms=round((picked - began) * 1e3, 2),
                            lines_ms=round((drawn - picked) * 1e3, 2))
        pacing = self.runner.draft_max > 0  # speculative decoding: drafts after each request's newest token
        if pacing:
            began += self.run_draft_model(going)  # (its forwards are counted apart: not the step's rows)
            cost = self.row_cost.fraction(len(going))  # a drafted row's, against a request's share of the step
            for seq in going:  # in the blocks left free once every request has its row's (never at the cost of a
                drafts = self.drafts(seq, cost)  # cached prefix or a request)
                if drafts and self.memory.grow_from_free(seq, seq.kv_len + 1 + len(drafts)):
                    seq.drafts = drafts
            self.fill_spare_rows(going)
        batches = self.batches(going)

        def write_held() -> None:  # (a second call writes nothing)
            for line in held:
                self.write(line)
            held.clear()
        for i, batch in enumerate(batches):
            started = time.perf_counter()
            self.runner.decode_batch(batch, write_held if held else None)  # (synchronous: a graph's replay waits
            # for its logits, as the CPU; the lines held written while it runs)
            self.trace.step("decode", started, rows=sum(1 + len(seq.drafts) for seq in batch))
            for seq in batch:
                seq.unstepped = False
                if i + 1 < len(batches):  # the next batch's replay reuses the buffers
                    self.runner.set_aside(seq)
        if held:  # (no forward: every request that drew paused for memory)
            write_held()
        if pacing and going:  # the whole step against its rows (the draws and the host's work too: a small
            # model's GPU step's most)
            self.row_cost.observe(sum(1 + len(s.drafts) for s in going), time.perf_counter() - began)

    def fill_spare_rows(self, going: list[Sequence]) -> None:
        """A decode graph computes its batch size's rows whatever the step holds (engine/runner/decode_graph.py:
        the rest are padding): rows that would be padding go to longer n-gram drafts, which cost the step nothing,
        the likeliest kept first (each drafter's record at its next position). Nothing without graphs (the CPU's
        rows each cost their pass), past one forward's rows, or for a request past FREE_ROW_KEYS positions (a row's
        attention reads the request's keys: 4K keys of the 8B shape are ~4% of its one-row step, 32K a third)."""
        decoder = self.runner.decoder
        rows = sum(1 + len(s.drafts) for s in going)
        if decoder is None or not rows or rows > self.runner.max_batch:
            return
        spare = decoder.size(rows) - rows
        watching = [s for s in going  # (a constrained answer's drafts are its grammar's: engine/runner/grammar_drafts.py)
                    if s.drafting and s.drafter.watches and s.kv_len <= FREE_ROW_KEYS and s.sampler.constraint is None]
        for seq in sorted(watching, key=lambda s: -s.drafter.alphas()[min(len(s.drafts), s.drafter.most - 1)]):
            if spare <= 0:
                return
            longer = seq.drafter.lookup(min(len(seq.drafts) + spare, seq.draft_room(self.runner.ctx)))
            if len(longer) > len(seq.drafts) and self.memory.grow_from_free(seq, seq.kv_len + 1 + len(longer)):
                spare -= len(longer) - len(seq.drafts)
                seq.drafts = longer

    def batches(self, going: list[Sequence]) -> list[list[Sequence]]:
        """The step's forwards: requests in order, as many a forward as hold at most max_batch rows (a request's
        newest token and its drafts; a forward's rows: the flash-decoding counters', the decode graphs')."""
        batches, rows = [[]], 0
        for seq in going:
            need = 1 + len(seq.drafts)
            if batches[-1] and rows + need > self.runner.max_batch:
                batches.append([])
                rows = 0
            batches[-1].append(seq)
            rows += need
        return batches if going else []

    def run_draft_model(self, going: list[Sequence]) -> float:
        """With a draft model (engine/runner/draft_model.py), its drafts for every request that drafts, in
        one batched run, before each request takes its own (drafts), each drafted token at its row's cost and a
        draft forward's (RowCost.draft_fraction). -> the seconds it took (0 without one)."""
        drafting = [s for s in going if s.drafting]
        model = self.runner.draft_model
        if model is None or not drafting:
            return 0.0
        started = time.perf_counter()
        model.propose(drafting, self.row_cost.draft_fraction(len(going), model.step_seconds, model.size_ratio))
        self.trace.step("draft", started, rows=len(drafting))
        return time.perf_counter() - started

    def drafts(self, seq: Sequence, cost: float) -> list[int]:
        """The tokens seq's drafter proposes after its newest at `cost` a row (none without one), as many as
        its answer and context may still take; for a constrained answer the stretch its grammar allows alone
        instead where there is one, else the drafter's cut where the grammar refuses (engine/runner/grammar_drafts.py)."""
        if not seq.drafting:
            return []
        room = seq.draft_room(self.runner.ctx)
        forced = forced_drafts(seq, min(room, self.runner.max_batch - 1), cost)  # a grammar's own stretch first
        return forced or allowed_drafts(seq, seq.drafter.propose(cost)[:room])

    def draw(self, seq: Sequence, now: float, held: list[m.Token] | None = None) -> bool:
        """The request's next token from its logits, written out (into `held` where given and the request goes
        on: written by the caller); False if that ends it. After a step with drafts, while the token drawn is the
        next draft, that draft's row was the token's own: the next token is drawn from its logits, and so on (the
        tokens are those one-token steps give). The drafter counts its drafts before a DONE reports them."""
        if seq.decode_started is None:
            seq.decode_started = now
        if seq.replay:  # a continuation's token drawn before the engine restarted: through the model again, as it went
            token = seq.replay.pop(0)
            seq.generated.append(token)
            if seq.drafter is not None:
                seq.drafter.extend([token])
            seq.unstepped = True
            return True
        drafts, accepted, start = seq.drafts[: len(seq.draft_logits)], 0, len(seq.generated)
        while True:
            token = self.runner.sample(seq)
            ended = self.emit(seq, token, held)
            if accepted < len(drafts) and token == drafts[accepted]:  # the draft was the model's own token
                accepted += 1
                if ended is None:
                    seq.logits = seq.draft_logits[accepted - 1]
                    if seq.graph_row is not None:  # the draft's row of the decode graph: the one after
                        seq.graph_row += 1
                    continue
            break
        if seq.drafter is not None:
            if drafts:
                seq.drafter.verified(len(drafts), accepted)
            seq.drafter.extend(seq.generated[start:])
        seq.drafts, seq.draft_logits = [], []
        if ended in ("stop", "length"):
            self.admission.finish(seq, ended)
        if ended is None:
            seq.unstepped = True
        return ended is None

    def emit(self, seq: Sequence, token: int, held: list[m.Token] | None = None) -> str | None:
        """A drawn token accepted by the request's sampler and written out (with its log-probabilities
        if the request asked, from the logits it was drawn from: before the sampler moves on; into `held` where
        given and the request goes on). None if the request goes on, else why it ends: stop or length (the caller
        finishes it), or dropped (an ERR has ended it)."""
        logprob, top = self.runner.logprobs(seq, token) if seq.logprobs is not None \
            else (None, ())
        try:
            seq.sampler.accept(token)
        except GrammarError as e:
            self.admission.drop(seq, f"constrained decoding failed: {e}")
            return "dropped"
        seq.generated.append(token)
        line = m.Token(token, seq.id, logprob, top)
        ended = "stop" if token in seq.stop_ids else "length" if len(seq.generated) >= seq.max_new else None
        if held is None or ended is not None:
            self.write(line)
        else:
            held.append(line)
        return ended
