"""Prompt log-probabilities (GEN prompt_logprobs=N): as a request's prompt is read, each prompt token's
log-probability under the logits of the row before it, and the N likeliest tokens there, written as PLP
lines after the step (what evaluation harnesses score a text by: OpenAI's completions with echo and
logprobs). The rows are the final norm's output that the head reads (LlamaModel.final_logits'
hidden_rows, as embeddings take them: engine/runner/pooling.py), through the head, in float64.

Every row from position 0 must be computed, so such a request reuses no cached prefix
(engine/loop/admission.py). The last prompt row's logits are those its first token is drawn from:
its log-probability comes with that token's T line. A hybrid model's read may start again at its recurrent
state's mark, before rows already scored: a row is scored once, the first time it is read."""
from __future__ import annotations

import numpy as np

from protocol import messages as m

SCORE_ROWS = 256  # rows through the head at once (their logits on the device, float64 on the host)


def scores_refusal(runner) -> str | None:
    """Why this engine cannot give prompt log-probabilities, or None."""
    if getattr(runner, "world", 1) > 1:
        return "prompt log-probabilities are not available under --tp (the head's rows are split across the ranks)"
    if not hasattr(runner, "model"):
        return "this engine does not give prompt log-probabilities"
    return None


class PromptScorer:
    """One request's prompt log-probabilities, computed as its rows are read."""

    reuses = False  # every row from position 0 is wanted

    def __init__(self, prompt: tuple[int, ...], top: int, model):
        self.prompt, self.top, self.model = prompt, top, model
        self.lines: list[m.PromptLogprobs] = []  # written after the step (engine/loop/rounds.py)
        self.scored = 0  # rows [0, scored) scored already

    def wanted(self, start: int, end: int) -> list[int]:
        """Of a read's rows [start, end) (offsets from start), those that score a prompt token: all but
        the prompt's last row (its logits draw the first answer token), and none scored before."""
        return list(range(max(self.scored, start) - start, min(end, len(self.prompt) - 1) - start))

    def add(self, hidden, start: int, end: int) -> None:
        """hidden: (len(wanted(start, end)), dim) float32, the normed rows [first, first + n) of the read's
        rows [start, end), first the first row not scored before; through the head SCORE_ROWS at a time (a step's
        4,096 rows of a 152K vocabulary would be 2.5 GB of float32 logits on the device and twice that on the host,
        beside a KV pool sized to what the scratch leaves)."""
        start = max(self.scored, start)
        for at in range(0, len(hidden), SCORE_ROWS):
            self.score(hidden[at: at + SCORE_ROWS], start + at)
        self.scored = start + len(hidden)

    def score(self, hidden, start: int) -> None:
        """A PLP line: prompt tokens start + 1 .. start + n scored by hidden (n, dim), rows start .. start + n - 1."""
        ops = self.model.ops
        x = self.model.backend.to_host(ops.logits(hidden, self.model.w.head)).astype(np.float64)  # (n, vocab)
        peak = x.max(axis=1, keepdims=True)
        logz = peak + np.log(np.exp(x - peak).sum(axis=1, keepdims=True))  # (n, 1)
        nxt = np.asarray(self.prompt[start + 1 : start + 1 + len(x)])  # (n,) the tokens scored
        lps = x[np.arange(len(x)), nxt] - logz[:, 0]
        tops = ()
        if self.top:
            best = np.argpartition(-x, self.top - 1, axis=1)[:, : self.top]  # (n, top), unordered
            tops = tuple(tuple((int(t), float(x[r, t] - logz[r, 0])) for t in sorted(row, key=lambda t: (-x[r, t], t)))
                         for r, row in enumerate(best))
        self.lines.append(m.PromptLogprobs(start + 1, tuple(float(v) for v in lps), tops))

    def take(self, ident) -> list[m.PromptLogprobs]:
        """The lines of the reads so far, for the request `ident`, handed over once."""
        out, self.lines = [m.PromptLogprobs(line.start, line.logprobs, line.top, ident) for line in self.lines], []
        return out
