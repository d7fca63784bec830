"""Drafts for speculative decoding from the request's own context (issue 47): an agent's answer repeats
what it has read (a file rewritten with a small change, a tool call quoting code), so the tokens that
followed the latest earlier occurrence of the context's last n tokens are a likely continuation.

NgramDrafter keeps, for every n-gram of the context (n from MIN_N to MAX_N), where it last ended, and
proposes the tokens after the longest n-gram that occurred before. How many it proposes adapts to the
request's acceptance (engine/runner/draft_pace.py)."""
from __future__ import annotations

from engine.runner.draft_pace import DraftPace

MIN_N, MAX_N = 2, 4  # n-gram lengths matched, longest first (1 gives too many chance matches)


class NgramDrafter(DraftPace):
    def __init__(self, context, most: int):
        super().__init__(most)
        self.context: list[int] = []
        self.ends: dict[tuple[int, ...], int] = {}  # n-gram -> the position after its latest occurrence
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
        k = self.budget()
        if k == 0:
            return []
        for n in range(MAX_N, MIN_N - 1, -1):
            if len(self.context) < n:
                continue
            start = self.ends.get(tuple(self.context[-n:]))
            if start is not None:
                draft = self.context[start : start + k]
                if draft:
                    return draft
        return []

    def release(self) -> None:
        """The request ends or leaves the running set: nothing is held outside the request."""
