"""Drafts for speculative decoding from the request's own context (issue 47): an agent's answer repeats
what it has read (a file rewritten with a small change, a tool call quoting code), so the tokens that
followed the latest earlier occurrence of the context's last n tokens are a likely continuation.

NgramDrafter keeps, for every n-gram of the context (n from MIN_N to MAX_N), where it last ended, and
proposes the tokens after the longest n-gram that occurred before. The prompt's n-grams are indexed at once
in sorted arrays (PromptGrams: a 130K-token prompt in ~30 ms on 2 cores, where a dict filled a token at a time
held the engine's loop ~175 ms); the tokens that come after it go into a dict, looked up
first (they are the later occurrences). How many it proposes follows the request's acceptance and what a
drafted row costs (engine/runner/draft_pace.py); its record is what it could have proposed, at full length,
against the tokens that came (watch: a lookup costs nothing), whatever it drafted."""
from __future__ import annotations

from bisect import bisect_left

import numpy as np

from engine.runner.draft_pace import DraftPace

MIN_N, MAX_N = 2, 4  # n-gram lengths matched, longest first (1 gives too many chance matches)
# An n-gram's key: a polynomial hash of its ids modulo 2**64 (an odd multiplier spread over the word). Two n-grams
# sharing a key (about one chance in 2**64 / G for G n-grams) cost a draft that is not kept, never a wrong token.
BASE = 0x9E3779B97F4A7C15
MASK = (1 << 64) - 1


def gram_key(tokens) -> int:
    """The key of an n-gram (a sequence of token ids), as PromptGrams computes it for the prompt's."""
    key = 0
    for token in tokens:
        key = (key * BASE + int(token) + 1) & MASK
    return key


class PromptGrams:
    """The prompt's n-grams, n = MIN_N .. MAX_N: per n, the sorted keys of the n-grams followed by a token of the
    prompt and, beside each, the position after its latest occurrence (a key's lookup: a bisection)."""

    def __init__(self, prompt: np.ndarray):  # prompt: (L,) int64
        self.keys: dict[int, list[int]] = {}  # n -> G_n keys, sorted, unique (a list: bisect's fastest)
        self.ends: dict[int, np.ndarray] = {}  # n -> (G_n,) int64: the position after the latest occurrence
        tokens = prompt.astype(np.uint64)
        for n in range(MIN_N, MAX_N + 1):
            if len(tokens) <= n:
                break
            count = len(tokens) - n  # the n-grams ending before positions n .. L - 1
            keys = np.zeros(count, dtype=np.uint64)
            with np.errstate(over="ignore"):  # (the modulo 2**64 of gram_key)
                for i in range(n):
                    keys = keys * np.uint64(BASE) + tokens[i : i + count] + np.uint64(1)
            order = np.argsort(keys)  # (count,): the n-grams by key (equal keys in any order)
            ordered = keys[order]
            starts = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]])  # (G_n,): each key's first place
            self.keys[n] = ordered[starts].tolist()
            self.ends[n] = np.maximum.reduceat(order, starts) + n  # each key's latest n-gram, the position after

    def end(self, n: int, key: int) -> int | None:
        """The position after the latest occurrence of the n-gram with this key in the prompt, or None."""
        keys = self.keys.get(n)
        if keys is None:
            return None
        i = bisect_left(keys, key)
        return int(self.ends[n][i]) if i < len(keys) and keys[i] == key else None


class NgramDrafter(DraftPace):
    watches = True

    def __init__(self, context, most: int, escapes=None):
        super().__init__(most)
        prompt = np.asarray(context, dtype=np.int64)  # (L,)
        self.context: list[int] = prompt.tolist()
        self.prompt_grams = PromptGrams(prompt)
        self.prompt_len = len(prompt)
        self.escapes = escapes  # engine/runner/escaped_prompt.py PromptEscapes, or None: no escaped view
        self.escaped: list[int] | None = None  # the prompt as a JSON string's body spells it, once an escape came
        self.escaped_grams: PromptGrams | None = None
        self.ends: dict[tuple[int, int], int] = {}  # (n, key) -> after its latest occurrence past the prompt
        self.tail = {n: gram_key(self.context[-n:]) for n in range(1, min(MAX_N, len(self.context)) + 1)}
        # (n -> the key of the context's last n tokens: a lookup's, then the index's once the next token comes)
        self.watched: list[int] = []  # what is left of a draft not made: its tokens are checked as they come
        self.watched_kept = 0  # its tokens that came as drafted so far

    def extend(self, tokens) -> None:
        """Tokens appended to the context (each accepted or sampled token after the prompt)."""
        for token in tokens:
            self.watch(int(token))
            if self.escaped is None and self.escapes is not None and token in self.escapes.backslash:
                view = self.escapes.view(self.context[: self.prompt_len])  # (V,)
                self.escaped, self.escaped_grams = view.tolist(), PromptGrams(view)
            # the n-grams that end just before this token (the context's tail) are indexed now, with it as what
            # followed them (the tail itself is not: a lookup wants an earlier occurrence)
            at, token, tail = len(self.context), int(token), self.tail  # (at: this token's position)
            for n in range(MIN_N, min(MAX_N, at) + 1):
                self.ends[n, tail[n]] = at
            self.context.append(token)
            self.tail = {1: token + 1} | {n: (tail[n - 1] * BASE + token + 1) & MASK  # (gram_key, rolled on)
                                          for n in range(2, min(MAX_N, at + 1) + 1)}

    def propose(self, cost: float) -> list[int]:
        """Up to k tokens (draft_pace.py's, at `cost` a row) that followed the latest earlier occurrence of the
        context's longest matching tail; [] when k is 0 or nothing matches. The whole lookup (--draft-max tokens)
        is watched, whatever part of it is drafted, unless an earlier one still is."""
        draft = self.lookup(self.most)
        if draft and not self.watched:
            self.watched, self.watched_kept = draft, 0
        return draft[: self.budget(cost)] if draft else []

    def lookup(self, k: int) -> list[int]:
        """Up to k tokens after the latest earlier occurrence of the longest matching tail ([] if none): in the
        answer, else the prompt, else the prompt's escaped view (engine/runner/escaped_prompt.py) once made."""
        for n in range(MAX_N, MIN_N - 1, -1):
            key = self.tail.get(n)
            if key is None:
                continue
            start, source = self.ends.get((n, key)), self.context
            if start is None:
                start = self.prompt_grams.end(n, key)
            if start is None and self.escaped_grams is not None:
                start, source = self.escaped_grams.end(n, key), self.escaped
            if start is not None:
                draft = source[start : start + k]
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
