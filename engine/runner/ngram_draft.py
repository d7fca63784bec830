"""Drafts for speculative decoding from the request's own context (issue 47): an agent's answer repeats
what it has read (a file rewritten with a small change, a tool call quoting code), so the tokens that
followed the latest earlier occurrence of the context's last n tokens are a likely continuation.

NgramDrafter keeps, for every n-gram of the context (n from MIN_N to MAX_N), where it last ended, and
proposes the tokens after the longest n-gram that occurred before. How many it proposes adapts to the
request's acceptance: up to `most`, fewer after rejections, none for a while after repeated misses
(a request that gains nothing pays nothing), probing again later."""
from __future__ import annotations

MIN_N, MAX_N = 2, 4  # n-gram lengths matched, longest first (1 gives too many chance matches)
MISSES_TO_REST, REST_STEPS = 3, 16  # after that many fruitless drafts in a row, no drafts for that many steps


class NgramDrafter:
    def __init__(self, context, most: int):
        self.context: list[int] = []
        self.ends: dict[tuple[int, ...], int] = {}  # n-gram -> the position after its latest occurrence
        self.most, self.k = most, most  # the cap, and what the next draft may propose
        self.misses = self.rest = 0
        self.drafted = self.accepted = 0  # totals, reported with the request's DONE
        self.extend(context)

    def extend(self, tokens) -> None:
        """Tokens appended to the context (the prompt, then each accepted or sampled token)."""
        for token in tokens:
            # the n-grams that end just before this token are indexed now, with it as what followed them
            # (the context's own tail is not: a lookup wants an earlier occurrence)
            at = len(self.context)  # this token's position
            for n in range(MIN_N, min(MAX_N, at) + 1):
                self.ends[tuple(self.context[at - n : at])] = at
            self.context.append(int(token))

    def propose(self) -> list[int]:
        """Up to k tokens that followed the latest earlier occurrence of the context's longest matching
        tail; [] while resting or when nothing matches."""
        if self.rest:
            self.rest -= 1
            return []
        if self.k == 0:
            return []
        for n in range(MAX_N, MIN_N - 1, -1):
            if len(self.context) < n:
                continue
            start = self.ends.get(tuple(self.context[-n:]))
            if start is not None:
                draft = self.context[start : start + self.k]
                if draft:
                    return draft
        return []

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
