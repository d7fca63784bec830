"""Constrained decoding: a request's grammar as a mask over the vocabulary, applied before each pick
(engine/runner/sampler.py). llguidance does the work (a maintained grammar engine made for this: JSON
schemas, Lark grammars and regexes compiled against the tokenizer, the next-token mask computed
in well under a millisecond); here it is only fed the GGUF's tokenizer and the sampled tokens.

The grammar arrives on GEN as llguidance's own grammar text (serve/api/constraints.py writes it); the
server has already validated it, so a grammar the engine cannot compile is an ERR, not a crash.
"""
from __future__ import annotations

import numpy as np

import llguidance
import llguidance.numpy as llnp

from engine.modelfile.grammar_tokenizer import GrammarTokenizer
from engine.runner.sampler import allowed_tokens


class Constraint:
    """One request's grammar state: restrict(logits) before each pick, accept(token) after it."""

    def __init__(self, grammars: GrammarTokenizer, grammar: str):
        lltokenizer, vocab_size = grammars.lltokenizer, grammars.vocab_size
        self.matcher = llguidance.LLMatcher(lltokenizer, grammar)
        if self.matcher.is_error():
            raise ValueError(f"grammar: {self.matcher.get_error()}")
        self.vocab_size, self.eos = vocab_size, lltokenizer.eos_token
        self.bitmask = llnp.allocate_token_bitmask(1, vocab_size)  # (1, ceil(vocab / 32)) int32, reused

    def mask_words(self) -> np.ndarray:
        """The next token's mask: (ceil(vocab / 32),) uint32, bit t % 32 of word t // 32 set for each
        token t the grammar allows. Nothing allowed (a grammar in error) lets the end-of-turn token
        through."""
        llnp.fill_next_token_bitmask(self.matcher, self.bitmask, 0)
        words = self.bitmask[0].view(np.uint32)
        if not words.any():
            words[self.eos // 32] |= np.uint32(1 << (self.eos % 32))
        return words

    def restrict(self, logits, xp=np):
        """logits (vocab,) -> a float32 copy with every token the grammar forbids at -inf, where the
        logits are: on the host by one unpacking of the bit mask (faster than llguidance.numpy's
        apply_token_bitmask_inplace, which expands each word 32 times over); on the GPU (xp = cupy)
        the 4 KiB mask goes to the device instead of the logits to the host."""
        words = self.mask_words()
        if xp is np:
            allowed = np.unpackbits(words.view(np.uint8), bitorder="little")[: self.vocab_size].view(bool)
        else:
            allowed = allowed_tokens(xp, xp.asarray(words), self.vocab_size)
        return xp.where(allowed, logits.astype(np.float32, copy=False), np.float32(-np.inf))

    def forced(self) -> list[int]:
        """The tokens the grammar allows alone from here, one after another (llguidance's fast-forward tokens: a
        schema's keys, a single function's name, the punctuation between them), [] where the next token is the
        model's choice. A query: the state does not move."""
        return [int(t) for t in self.matcher.compute_ff_tokens()] if self.open else []

    def allowed_run(self, tokens: list[int]) -> int:
        """How many of `tokens`, one after another from here, the grammar allows (a query, as forced)."""
        return int(self.matcher.validate_tokens(tokens)) if self.open else 0

    @property
    def open(self) -> bool:
        """Whether the grammar still takes tokens (not ended, not in error)."""
        return not (self.matcher.is_stopped() or self.matcher.is_error())

    def accept(self, token: int) -> None:
        """The token picked (always one restrict() let through, or an end-of-turn token). A token the
        grammar then refuses (the mask and the grammar disagreeing: a bug, never the model's fault)
        is a GrammarError: the request ends with an error its client sees, not with a silent stop."""
        if not self.matcher.is_stopped():
            if not self.matcher.consume_token(token) or self.matcher.is_error():
                raise GrammarError(f"token {token} was allowed by the mask but refused by the grammar: "
                                   f"{self.matcher.get_error()}")


class GrammarError(ValueError):
    """The grammar's state broke on a token its own mask allowed."""


def compile_constraint(grammars, grammar: str) -> "Constraint":
    """A request's grammar state over the engine's tokenizer (`grammars`, None without one); ValueError
    if it does not compile."""
    if grammars is None:
        raise ValueError("this engine has no tokenizer for grammars")
    try:
        return Constraint(grammars, grammar)
    except Exception as e:  # whatever llguidance raises on a grammar it cannot take: an ERR, not a crash
        raise ValueError(f"grammar: {e}") from None
