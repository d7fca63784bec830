"""A prompt tokenized in segments cut before its control tokens, each segment's ids remembered.

An agent's every turn sends the whole conversation again: 30K tokens to tokenize for 200 new ones
(~30-50 ms of CPU on a server core, most of a later turn's time to first token). A chat template puts
control tokens (<|start_header_id|>, <|im_start|>) between the messages, and the tokenizer matches
added tokens in the text before anything else, then pre-tokenizes and merges each piece between them
on its own. So the text cut just before a control token tokenizes as its two sides do, and a side seen
before (the system prompt, the earlier turns) need not be tokenized again.

That holds when nothing the tokenizer does crosses a cut: added tokens match as written (no
normalisation, no stripping of the spaces beside them; GGUFTokenizer builds them so) and no added
token could match across a cut (one that ends with the start of a marker, or contains a marker,
after its first character). Markers that could are not cut at; `exact_on` checks a probe at start-up.
Segments are tokenized together in one batch call, which lets go of the GIL and spreads them over
the cores.
"""
from __future__ import annotations

import hashlib
import re
import threading
from array import array
from collections import OrderedDict

from tokenizers import Tokenizer

MAX_TOKENS = 4_000_000  # ids remembered, all segments together (4 bytes each: 16 MB)


def digest(segment: str) -> bytes:
    """What a segment is remembered by: its text's BLAKE2b (not the text, which may be megabytes)."""
    return hashlib.blake2b(segment.encode("utf-8", "surrogatepass"), digest_size=16).digest()


def safe_markers(markers: list[str], added: list[str]) -> list[str]:
    """The markers a cut may go before: no added token can start before the marker's first character
    and reach into it (a part of the token after its first character beginning the marker, or
    containing it whole)."""
    firsts = {m[0] for m in markers}
    unsafe = set()
    for token in added:
        for i in range(1, len(token)):
            if token[i] in firsts:
                rest = token[i:]
                unsafe.update(m for m in markers if m.startswith(rest) or rest.startswith(m))
    return [m for m in markers if m not in unsafe]


class SegmentCache:
    """Texts tokenized in segments cut before markers (control tokens), each segment's ids kept, the
    least recently used let go past MAX_TOKENS (without markers a text is one segment, kept whole).
    Safe to call from several threads at once."""

    def __init__(self, tk: Tokenizer, markers: list[str], added: list[str], max_tokens: int = MAX_TOKENS):
        self.tk, self.max_tokens = tk, max_tokens
        cuts = sorted(safe_markers([m for m in markers if m], added), key=len, reverse=True)
        firsts = "".join(sorted({re.escape(m[0]) for m in cuts}))
        # a look at the first character before the alternatives: only there are they tried
        self.pattern = re.compile(f"(?=[{firsts}])(?:{'|'.join(map(re.escape, cuts))})") if cuts else None
        self.kept: OrderedDict[bytes, array] = OrderedDict()  # digest(segment) -> its ids
        self.size = 0  # ids kept
        self.lock = threading.Lock()

    def segments(self, text: str) -> list[str]:
        if self.pattern is None:
            return [text]
        starts = [m.start() for m in self.pattern.finditer(text) if m.start() > 0]
        return [text[a:b] for a, b in zip([0, *starts], [*starts, len(text)])]

    def encode(self, text: str, limit: int | None = None) -> list[array]:
        """The text's ids, a segment at a time, in order (their concatenation is the text's ids). limit:
        more tokens than that raise TooManyTokens with their count, before the new segments' ids become
        Python lists (which holds the GIL: ~50 ms for 670K tokens on an idle core)."""
        parts = self.segments(text)
        keys = [digest(p) for p in parts]
        with self.lock:
            found = [self.kept.get(k) for k in keys]
            for k, ids in zip(keys, found):
                if ids is not None:
                    self.kept.move_to_end(k)
        missing = {k: p for k, p, ids in zip(keys, parts, found) if ids is None}  # each new segment once
        encodings = dict(zip(missing, self.tk.encode_batch_fast(list(missing.values()), add_special_tokens=False)))
        if limit is not None:
            count = sum(len(ids if ids is not None else encodings[k]) for k, ids in zip(keys, found))
            if count > limit:
                raise TooManyTokens(count)
        if missing:
            made = {k: array("I", e.ids) for k, e in encodings.items()}
            self.remember(made)
            found = [ids if ids is not None else made[k] for k, ids in zip(keys, found)]
        return found

    def remember(self, made: dict[bytes, array]) -> None:
        with self.lock:
            for key, ids in made.items():
                if key not in self.kept and len(ids) <= self.max_tokens:
                    self.kept[key] = ids
                    self.size += len(ids)
            while self.size > self.max_tokens:
                self.size -= len(self.kept.popitem(last=False)[1])

    def exact_on(self, text: str) -> bool:
        """Whether the text's ids in segments equal the whole text's (checked on a probe at start-up)."""
        whole = self.tk.encode_batch_fast([text], add_special_tokens=False)[0].ids
        pieces = self.tk.encode_batch_fast(self.segments(text), add_special_tokens=False)
        return [i for e in pieces for i in e.ids] == whole


class TooManyTokens(ValueError):
    """A text of more tokens than the caller's limit: `tokens` of them."""

    def __init__(self, tokens: int):
        super().__init__(f"{tokens} tokens")
        self.tokens = tokens
