"""The log-probabilities a request asked for (GEN logprobs=N), computed on the GPU: a step's rows in one launch.

Each token's log-probability is x[token] - logz under the logits its draw read, logz the row's log-partition. On the
host (Sampler.logprobs) a row costs its logits copied back and an fp64 sum over the vocabulary: ~0.4 ms a row of a
128K vocabulary, 27 ms of a 64-row decode step's 44 on an H100 (bench/HISTORY.md, seventeenth session), the
decoders' every token that much later. Here the rows whose draw reads the logits as they are (Sampler.plain: no
penalty, no grammar) go through argmax.cu's row_logprobs: ahead of a step's draws, once its rows' tokens are known (a
greedy row's from its decode graph's argmax, a sampled row's from the batched draws), every such row in one launch
and one copy back; a row not known ahead (a draft's, a continuation's) alone through the same kernel. A row's figures
come from a block of its own in a fixed order, so a request's log-probabilities are the same whatever else the step
holds. The top tokens need the row on the host: copied for the requests that asked for them only, its log-partition
the kernel's. Penalized or constrained rows stay with Sampler.logprobs (their logits are changed on the host).
"""
from __future__ import annotations

import numpy as np

from engine.runner.sampler import top_scores
from engine.runner.sequence import Sequence


class LogprobRows:
    def __init__(self, cp, kernels, decoder):
        """decoder: the decode graphs (engine/runner/decode_graph.py), whose replay's argmax gives a greedy row's
        token and whose output buffer holds the step's rows."""
        self.cp, self.kernels, self.decoder = cp, kernels, decoder

    def ahead(self, seqs: list[Sequence]) -> None:
        """The log-probabilities of the next tokens of seqs that asked for them, wherever those tokens are known
        before they are drawn, in one launch; each kept in seq.scored for logprobs()."""
        for seq in seqs:
            seq.scored = None  # (one left from a step whose draw it missed is not this step's)
        rows = [(seq, token) for seq in seqs if (token := self.known_token(seq)) is not None]
        if not rows:
            return
        graph_rows = [seq.graph_row for seq, _ in rows]
        gather = None if None in graph_rows else (self.decoder.logits, graph_rows)
        for (seq, token), scored in zip(rows, self.score([(seq.logits, token) for seq, token in rows], gather)):
            seq.scored = (token, *scored)

    def known_token(self, seq: Sequence) -> int | None:
        """seq's next token where it asked for log-probabilities of plain logits and the token is known before its
        draw: drawn with the step's other rows (seq.picked) or the argmax its decode graph computed."""
        if seq.logprobs is None or not seq.sampler.plain or seq.draft_logits or seq.replay or seq.logits is None:
            return None
        if seq.picked is not None:
            return seq.picked
        if seq.sampler.plain_greedy and seq.graph_row is not None and self.decoder is not None:
            return self.decoder.greedy_token(seq.graph_row)
        return None

    def logprobs(self, seq: Sequence, token: int) -> tuple[float, tuple[tuple[int, float], ...]]:
        """token's log-probability under seq's logits (plain: Sampler.plain) and the seq.logprobs likeliest
        tokens': as scored ahead, else scored now alone."""
        scored, seq.scored = seq.scored, None
        if scored is None or scored[0] != token:
            scored = (token, *self.score([(seq.logits, token)])[0])
        _, logz, logprob = scored
        top = top_scores(seq.logits.get(), seq.logprobs, logz) if seq.logprobs else ()
        return logprob, top

    def score(self, rows: list[tuple[object, int]], gather: tuple | None = None) -> list[tuple[float, float]]:
        """(logz, the token's log-probability) of each (logits (vocab,) fp32 on the device, token). gather:
        (matrix, indices) when the rows are rows of one matrix (a decode graph's output)."""
        cp = self.cp
        if gather is not None:
            source, index = gather
            logits = cp.take(source, cp.asarray(np.asarray(index, dtype=np.int64)), axis=0)  # (rows, vocab)
        else:
            logits = cp.stack([cp.ascontiguousarray(x, dtype=cp.float32).reshape(-1) for x, _ in rows])
        tokens = cp.asarray(np.asarray([token for _, token in rows], dtype=np.int64))
        return [(float(logz), float(lp)) for logz, lp in self.kernels.row_logprobs(logits, tokens).get()]
