"""One request's state inside the engine, from GEN to DONE, across parks."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from engine.runner.sampler import Sampler


@dataclass(eq=False)  # (one request is one object: `seq in line` asks which, never compares every field)
class Sequence:
    id: int | None
    prompt: tuple[int, ...]
    max_new: int
    sampler: Sampler
    stop_ids: frozenset[int]
    fingerprints: bool = False
    drawn: int = 0  # tokens generated before an engine restart (GEN drawn=): `replay` first, then generated's first
    replay: list[int] = field(default_factory=list)  # of those, the ones not yet through the model: each goes through
    # as a decode row, as it did before the restart (not drawn again, not written out), so that its rows have those
    # bits and the tokens after it are the ones the request would have had (engine/loop/decode_steps.py draw)
    session: str | None = None  # its client's session (GEN session=): its cached blocks are evicted last
    logprobs: int | None = None  # GEN logprobs=N: each token's log-probability and the N likeliest, or none
    pos: int = 0  # prompt tokens read so far (KV rows filled)
    table: list[int] = field(default_factory=list)  # its KV blocks in position order (empty while in host memory)
    cached: int = 0  # prompt tokens whose rows the prefix cache already held (not read again)
    from_host: int = 0  # of those, tokens whose rows came back from the host tier (--cache-ram)
    generated: list[int] = field(default_factory=list)
    logits: np.ndarray | None = None  # (vocab,) of the last position read, until sampled
    graph_row: int | None = None  # the logits are this row of the latest decode graph replay's
    picked: int | None = None  # its next token, drawn with the step's other rows (engine/runner/batch_draws.py)
    scored: tuple | None = None  # (that token, logz, its log-probability) scored with the step's other rows
    # (engine/runner/logprob_rows.py), where it asked for them
    yield_wanted: bool = False  # a boundary offer: park at the next chunk boundary if the gates pass
    parked: bool = False  # parked at a chunk boundary: its rows stay in its blocks until moved out
    paused: bool = False  # moved to host memory under memory pressure; brought back first
    unstepped: bool = False  # its newest token is drawn but not yet through the model (logits are stale)
    state: object = None  # a hybrid model's recurrent state (engine/kvcache/recurrent.py SequenceState)
    drafter: object = None  # speculative decoding's drafter (engine/runner/ngram_draft.py NgramDrafter,
    # engine/runner/draft_model.py ModelDrafter), or none
    drafts: list[int] = field(default_factory=list)  # tokens whose rows went through the last forward after the newest
    draft_logits: list = field(default_factory=list)  # the logits after each of them: drafts[i]'s row
    pool: object = None  # GEN embed=1: its pooled hidden state (engine/runner/pooling.py SequencePool), else None
    scorer: object = None  # GEN prompt_logprobs=N: its prompt's log-probabilities (engine/runner/prompt_scores.py)
    settling: bool = False  # DONE is out: its answer's rows are read again as prompt rows, to be shared
    parked_seq: int = 0  # when it parked (a counter): the longest parked spills first
    parks: int = 0
    park_ms: float = 0.0  # time spent copying snapshots out and back in
    prompt_ms: float = 0.0
    row_ms: float | None = None  # its latest prompt step's own time a row (its next step's pauses are planned by it)
    decode_ms: float = 0.0
    shared_ms: float = 0.0  # the others' decode steps run while it was reading (between and inside its chunks)
    decode_started: float | None = None  # perf_counter at its first token
    finish: str | None = None

    @property
    def total(self) -> int:
        return len(self.prompt)

    @property
    def reading(self) -> bool:
        return self.pos < self.total

    @property
    def decoding(self) -> bool:
        return not self.reading and self.finish is None and not self.paused

    @property
    def draws_ahead(self) -> bool:
        """Its next token may be drawn with the step's other rows (a GPU's batched draws, engine/runner/picks.py): a
        plain temperature draw (Sampler.batchable) not yet drawn, from its own logits (none of a draft's after them),
        not a continuation's token going through again."""
        return self.sampler.batchable and self.picked is None and not self.draft_logits and not self.replay

    @property
    def drafting(self) -> bool:
        """It drafts the rows after its newest token (speculative decoding): a drafter, and no continuation's tokens
        so far still to go through (those are its next rows)."""
        return self.drafter is not None and not self.replay

    @property
    def kv_len(self) -> int:
        """The newest token's position: the prompt plus all generated tokens but the newest (the rows
        a decode step attends to before writing the newest token's)."""
        return self.pos + max(0, len(self.generated) - 1)

    @property
    def rows(self) -> int:
        """K/V rows written now: kv_len, and the newest token's too once it has been through the model
        (between two decode steps; not while it is drawn and waiting for its forward, unstepped)."""
        return self.kv_len + (1 if self.generated and not self.unstepped else 0)

    def draft_room(self, ctx: int) -> int:
        """Drafts the answer and the context (ctx positions) may still take after the newest token."""
        return max(0, min(self.max_new - len(self.generated), ctx - self.kv_len - 1))
