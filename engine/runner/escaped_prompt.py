"""The prompt as the body of a JSON string spells it, a second source for the n-gram drafter (issue 47): an agent's
tool call carries code in its JSON arguments (a file written whole, an edit's old and new text), where each line
break of the file it read is the two characters `\\n` and each quote `\\"`. Re-tokenized so, the code's tokens run as
the call writes them, where the prompt's own tokens part from the call's at every line's start (a draft's
n-gram then misses each line's first tokens).

A request's view is made once, at the first token with a backslash in its answer (an escape: the answer is writing
a JSON string, or code that has one), of the prompt's last VIEW_TOKENS tokens: a decode and an encode by the
`tokenizers` library, some milliseconds for a few thousand tokens."""
from __future__ import annotations

import json

import numpy as np

VIEW_TOKENS = 16384  # the prompt's last tokens a view covers (the file an agent just read is near the end)


class PromptEscapes:
    """An engine's tokenizer for the views, and which of its tokens hold a backslash (an escape's start)."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.backslash = frozenset(i for i, text in enumerate(tokenizer.tokens) if "\\" in text)

    def view(self, prompt) -> np.ndarray:
        """(n,) int64: the prompt's last VIEW_TOKENS tokens as text, written as a JSON string's body, tokenized."""
        text = self.tokenizer.decode([int(t) for t in prompt[-VIEW_TOKENS:]])
        body = json.dumps(text, ensure_ascii=False)[1:-1]
        return np.asarray(self.tokenizer.encode(body, add_bos=False), dtype=np.int64)
