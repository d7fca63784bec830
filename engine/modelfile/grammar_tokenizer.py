"""llguidance's view of a model's tokenizer: what a grammar (a JSON schema, a Lark grammar, a regex) is
compiled against. The server checks a request's grammar with it before queueing the request
(serve/api/constraints.py); the engine builds each request's mask from it (engine/runner/grammar_mask.py)."""
from __future__ import annotations

import llguidance


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
