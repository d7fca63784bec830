"""How a request's next token is drawn from its logits, where they are.

On the CPU: Sampler.sample over NumPy (penalties, grammar, greedy or sampler.pick). On the GPU, by
what the request asks for, the same way for each of its tokens:
- plain greedy: after a decode graph's replay, the argmax the graph computed (8 bytes back); else the
  logits copied to the host and their argmax;
- a plain temperature draw (Sampler.batchable): the batched draws (engine/runner/batch_draws.py), with
  the step's other such rows, queued behind the forward that computes their logits (DrawsBehind: their tokens
  back with its wait) or, where that cannot be, ahead at the step (one launch and one copy back), or as a batch
  of one (a prompt's last row) — the same arithmetic every way;
- penalized or constrained: a captured draw of its parameter set (engine/runner/sampling_graph.py).
The log-probabilities a request asks for: on the GPU a step's rows in one launch where the draw reads the logits
as the model left them (engine/runner/logprob_rows.py), else Sampler.logprobs on the host.
"""
from __future__ import annotations

from engine.runner.batch_draws import BatchDraws
from engine.runner.logprob_rows import LogprobRows
from engine.runner.sampler import SamplingParams
from engine.runner.sampling_graph import DrawGraphs
from engine.runner.sequence import Sequence


class Picks:
    def __init__(self, backend, decoder, vocab: int):
        """decoder: the decode graphs (engine/runner/decode_graph.py), None off the GPU or without graphs."""
        self.backend, self.decoder = backend, decoder
        gpu = decoder is not None
        self.draws = DrawGraphs(backend.xp) if gpu else None
        self.batch = BatchDraws(backend.xp, backend.kernels, vocab) if gpu else None
        self.scores = LogprobRows(backend.xp, backend.kernels, decoder) if backend.name == "gpu" else None

    def sample(self, seq: Sequence) -> int:
        if seq.picked is not None:  # drawn with its step's other rows (ahead)
            token, seq.picked = seq.picked, None
            return token
        if seq.sampler.plain_greedy:
            if seq.graph_row is not None:
                return self.decoder.greedy_token(seq.graph_row)
        elif self.batch is not None and seq.sampler.batchable:  # a batch of one
            return self.batch.draw([(seq.logits, seq.sampler.params, seq.sampler.uniform())])[0]
        elif self.draws is not None:  # a decode row's or a prompt's last row alike: copied into the graph's input
            return seq.sampler.sample(seq.logits, self.backend.xp, self.draws)
        return seq.sampler.sample(seq.logits, self.backend.xp)

    def ahead(self, seqs: list[Sequence]) -> None:
        """The next tokens of the plain sampling requests among seqs (each about to be drawn, in this order)
        drawn together, each kept in seq.picked for its sample(); the uniforms taken here, one each. (Not a
        continuation's tokens so far: they go through again, not drawn.) Then the log-probabilities of the tokens
        known so, where asked (LogprobRows.ahead)."""
        if self.batch is not None:
            self.draw_ahead(seqs)
        if self.scores is not None:
            self.scores.ahead(seqs)

    def draw_ahead(self, seqs: list[Sequence]) -> None:
        rows = [s for s in seqs if s.draws_ahead]
        for start in range(0, len(rows), self.batch.rows):
            batch = rows[start : start + self.batch.rows]
            graph_rows = [s.graph_row for s in batch]  # (a decode step's rows: one gather from the graph's output)
            gather = None if None in graph_rows else (self.decoder.logits, graph_rows)
            tokens = self.batch.draw([(s.logits, s.sampler.params, s.sampler.uniform()) for s in batch], gather)
            for seq, token in zip(batch, tokens):
                seq.picked = token

    def behind(self, seqs: list[Sequence], first: list[int]) -> "DrawsBehind | None":
        """The batched draws of a decode forward's plain sampling rows queued right behind it on the device
        (DrawsBehind), where the GPU draws them: seqs the forward's requests, first each one's first row."""
        if self.batch is None:
            return None
        rows = [(seq, row) for seq, row in zip(seqs, first) if seq.draws_ahead and not seq.drafts]  # (at a launch
        # draft_logits are empty: draw resets them; a row with drafts after it is drawn in the draw's own loop)
        return DrawsBehind(self.batch, rows[: self.batch.rows]) if rows else None

    def set_aside(self, seq: Sequence) -> None:
        """seq's logits leave the decode graph's output buffer, which the next replay overwrites (paused for memory,
        or in an earlier forward of a step of several): a plain greedy row's token is taken now from the argmax the
        replay computed (what sample would return: else its logits copied, then a draw of their own, ~0.2 ms a row
        at the next step), and the logits are copied only where something still reads them (a token not known yet,
        log-probabilities, drafts' rows). A request whose token is drawn already (unstepped: paused for memory after
        its draw) keeps them as before."""
        if seq.graph_row is None or seq.logits is None:
            return
        if not seq.unstepped and not seq.draft_logits:
            if seq.picked is None and seq.sampler.plain_greedy:
                seq.picked = self.decoder.greedy_token(seq.graph_row)
            if seq.picked is not None and seq.logprobs is None:
                seq.logits, seq.graph_row = None, None  # (its token is known, and nothing else reads them)
                return
        seq.logits, seq.graph_row = seq.logits.copy(), None
        seq.draft_logits = [logits.copy() for logits in seq.draft_logits]  # (rows of the same buffer)

    def logprobs(self, seq: Sequence, token: int) -> tuple[float, tuple[tuple[int, float], ...]]:
        """The log-probability of seq's drawn token and of its seq.logprobs likeliest (Sampler.logprobs), under the
        logits the draw read."""
        if self.scores is not None and seq.sampler.plain:
            return self.scores.logprobs(seq, token)
        return seq.sampler.logprobs(seq.logits, token, seq.logprobs)

    def prepare(self, logits) -> None:
        """At start, on logits (vocab,) of the warm-up's decode: every kind of pick once (the GPU's sampling
        kernels compiled on a machine's first start, their graphs captured), so that no request waits for it."""
        if self.batch is None:
            return
        self.draws.prepare(logits)
        self.batch.draw([(logits, SamplingParams(temperature=1.0), 0.5)])


class DrawsBehind:
    """A decode forward's plain sampling rows (each request's next token from the forward's logits) drawn right
    behind the forward, on its stream, from its output matrix: their tokens come back with the forward's own wait
    (no launch, copy and wait of their own between two steps, the device idle meanwhile), and the next step takes
    them from seq.picked. Each request's uniform is taken here, one for the token, as its draw would: the tokens
    are those a draw at the next step gives (the same graph over the same logits)."""

    def __init__(self, batch: BatchDraws, rows: list[tuple[Sequence, int]]):
        """rows: (request, its row of the forward's logits), at most batch.rows."""
        self.batch, self.rows = batch, rows
        self.uniforms: list[float] | None = None
        self.stream = None

    def launch(self, logits) -> None:
        """Queue the draws on the current stream, behind the forward that writes logits (rows, vocab) fp32:
        nothing where their graph is not captured yet (the next step draws them: BatchDraws.draw captures it).
        Called again (a forward redone), it queues them again with the same uniforms."""
        params = [seq.sampler.params for seq, _ in self.rows]
        if not self.batch.ready(*self.batch.key(params)):
            return
        if self.uniforms is None:
            self.uniforms = [seq.sampler.uniform() for seq, _ in self.rows]
        stream = self.batch.cp.cuda.get_current_stream()
        rows = [(None, p, u) for p, u in zip(params, self.uniforms)]
        if self.batch.launch(rows, (logits, [row for _, row in self.rows]), stream):
            self.stream = stream

    def collect(self) -> None:
        """Once the forward is waited for: each drawn request's token into seq.picked."""
        if self.stream is None:
            return
        for (seq, _), token in zip(self.rows, self.batch.collect(len(self.rows), self.stream)):
            seq.picked = token
