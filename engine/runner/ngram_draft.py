"""Drafts for speculative decoding from the request's own context (issue 47): an agent's answer repeats
what it has read (a file rewritten with a small change, a tool call quoting code), so the tokens that
followed the latest earlier occurrence of the context's last n tokens are a likely continuation.

NgramDrafter keeps, for every n-gram of the context (n from MIN_N to MAX_N), where it last ended, and
proposes the tokens after the longest n-gram that occurred before. How many it proposes follows the
request's acceptance and what a drafted row costs (engine/runner/draft_pace.py); its record is what it could have
proposed, at full length, against the tokens that came (watch: a lookup costs nothing), whatever it drafted."""
from __future__ import annotations

from engine.runner.draft_pace import DraftPace

MIN_N, MAX_N = 2, 4  # n-gram lengths matched, longest first (1 gives too many chance matches)


class NgramDrafter(DraftPace):
    watches = True

    def __init__(self, context, most: int):
        super().__init__(most)
        self.context: list[int] = []
        self.ends: dict[tuple[int, ...], int] = {}  # n-gram -> the position after its latest occurrence
        self.watched: list[int] = []  # what is left of a draft not made: its tokens are checked as they come
        self.watched_kept = 0  # its tokens that came as drafted so far
        self.extend(context)

    def extend(self, tokens) -> None:
        """Tokens appended to the context (the prompt, then each accepted or sampled token)."""
        for token in tokens:
            self.watch(int(token))
            # the n-grams that end just before this token are indexed now, with it as what followed them
            # (the context's own tail is not: a lookup wants an earlier occurrence)
            at = len(self.context)  # this token's position
            for n in range(MIN_N, min(MAX_N, at) + 1):
                self.ends[tuple(self.context[at - n : at])] = at
            self.context.append(int(token))

    def propose(self, cost: float) -> list[int]:
        """Up to k tokens (draft_pace.py's, at `cost` a row) that followed the latest earlier occurrence of the
        context's longest matching tail; [] when k is 0 or nothing matches. The whole lookup (--draft-max tokens)
        is watched, whatever part of it is drafted, unless an earlier one still is."""
        draft = self.lookup(self.most)
        if draft and not self.watched:
            self.watched, self.watched_kept = draft, 0
        return draft[: self.budget(cost)] if draft else []

    def lookup(self, k: int) -> list[int]:
        """Up to k tokens after the latest earlier occurrence of the longest matching tail ([] if none)."""
        for n in range(MAX_N, MIN_N - 1, -1):
            if len(self.context) < n:
                continue
            start = self.ends.get(tuple(self.context[-n:]))
            if start is not None:
                draft = self.context[start : start + k]
                if draft:
                    return draft
        return []

    def watch(self, token: int) -> None:
        """The next token against the watched draft's next: its record once it is settled (a miss, or all kept)."""
        if not self.watched:
            return
        if token != self.watched[0]:
            self.observe(self.watched_kept, self.watched_kept + 1)
            self.watched, self.watched_kept = [], 0
            return
        self.watched, self.watched_kept = self.watched[1:], self.watched_kept + 1
        if not self.watched:
            self.observe(self.watched_kept, self.watched_kept)
            self.watched_kept = 0

    def release(self) -> None:
        """The request ends or leaves the running set: nothing is held outside the request."""
