"""Constrained decoding: a request's grammar as a mask over the vocabulary, applied before each pick
(engine/sampler.py). llguidance does the work (a maintained grammar engine made for this: JSON
schemas, Lark grammars and regexes compiled against the tokenizer, the next-token mask computed
in well under a millisecond); here it is only fed the GGUF's tokenizer and the sampled tokens.

The grammar arrives on GEN as llguidance's own grammar text (serve/constraints.py writes it); the
server has already validated it, so a grammar the engine cannot compile is an ERR, not a crash.
"""
from __future__ import annotations

import numpy as np

import llguidance
import llguidance.numpy as llnp


class GrammarTokenizer:
    """llguidance's view of the model's tokenizer, built once on first use (~0.3 s for a 49K
    vocabulary) from the tokenizers.Tokenizer the GGUF's vocabulary and merges make."""

    def __init__(self, tokenizer, vocab_size: int):
        self.source, self.vocab_size = tokenizer, vocab_size
        self._built = None

    @property
    def lltokenizer(self):
        if self._built is None:
            tk = self.source
            self._built = llguidance.LLTokenizer(tk.tk.to_str(), n_vocab=self.vocab_size, eos_token=tk.special.eos)
        return self._built

    def constraint(self, grammar: str) -> "Constraint":
        return Constraint(self.lltokenizer, grammar, self.vocab_size)


class Constraint:
    """One request's grammar state: allowed() -> (vocab,) bool for the next token; accept(token)."""

    def __init__(self, lltokenizer, grammar: str, vocab_size: int):
        self.matcher = llguidance.LLMatcher(lltokenizer, grammar)
        if self.matcher.is_error():
            raise ValueError(f"grammar: {self.matcher.get_error()}")
        self.vocab_size, self.matcher_eos = vocab_size, [lltokenizer.eos_token]
        self.bitmask = llnp.allocate_token_bitmask(1, vocab_size)  # (1, ceil(vocab / 32)) int32

    def allowed(self) -> np.ndarray:
        """(vocab,) bool. Nothing allowed (a grammar in error) lets the end-of-turn tokens through."""
        llnp.fill_next_token_bitmask(self.matcher, self.bitmask, 0)
        mask = np.unpackbits(self.bitmask[0].view(np.uint8), bitorder="little")[: self.vocab_size].astype(bool)
        if not mask.any():
            mask[self.matcher_eos] = True
        return mask

    def accept(self, token: int) -> None:
        """The token picked (always one allowed() let through, or an end-of-turn token)."""
        if not self.matcher.is_stopped():
            self.matcher.consume_token(token)
