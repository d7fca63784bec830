"""How many tokens a request's drafter may propose at its next step (speculative decoding, issue 47),
from how its drafts have fared: up to `most`, more after a draft kept whole, fewer after a rejection,
none for a while after repeated misses (a request that gains nothing pays nothing), probing again
later. Both drafters adapt and count through it: the n-gram drafter (engine/runner/ngram_draft.py)
and the draft model's (engine/runner/draft_model.py)."""
from __future__ import annotations

MISSES_TO_REST, REST_STEPS = 3, 16  # after that many fruitless drafts in a row, no drafts for that many steps


class DraftPace:
    def __init__(self, most: int):
        self.most, self.k = most, most  # the cap, and what the next draft may propose
        self.misses = self.rest = 0
        self.drafted = self.accepted = 0  # totals, reported with the request's DONE

    def budget(self) -> int:
        """The most tokens this step's draft may have: 0 while resting (a step of the rest is spent)."""
        if self.rest:
            self.rest -= 1
            return 0
        return self.k

    def verified(self, proposed: int, accepted: int) -> None:
        """A draft of `proposed` tokens of which the first `accepted` were the model's own: k follows."""
        self.drafted += proposed
        self.accepted += accepted
        if accepted == proposed:
            self.k, self.misses = min(self.most, self.k + 2), 0
            return
        self.k = max(1, accepted + 1)
        self.misses = self.misses + 1 if accepted == 0 else 0
        if self.misses >= MISSES_TO_REST:
            self.rest, self.misses, self.k = REST_STEPS, 0, 1
