"""A prompt that cannot fit the context whatever its tokenization, refused before it is tokenized.

No token stands for more text than the vocabulary's longest token, so a prompt of more bytes than
ctx x that length needs more than ctx tokens: it is refused as too long at the cost of measuring
it, where tokenizing it would take seconds (a 20 MB prompt: 22 s on the CPU). A shorter prompt is
tokenized, and build_request measures it exactly.
"""
from __future__ import annotations

from dataclasses import dataclass

from tokenizers.pre_tokenizers import ByteLevel

from serve.api.errors import prompt_too_long

# byte-level BPE spells each byte of text as one of these 256 characters (GPT-2's byte-to-char map)
BYTE_LEVEL_CHARS = frozenset(ByteLevel.alphabet())


def token_text_bytes(token: str, added: bool) -> int:
    """How many bytes of prompt text one token stands for at most. A byte-level token: one byte a
    character. An added token (<|im_start|>) is matched in the text as written: its UTF-8 length,
    as for any token with characters outside the byte map (UTF-8 never counts fewer bytes)."""
    if not added and BYTE_LEVEL_CHARS.issuperset(token):
        return len(token)
    return len(token.encode("utf-8", "surrogatepass"))


def longest_token_bytes(tokenizer) -> int:
    added = tokenizer.added
    return max(token_text_bytes(t, t in added) for t in tokenizer.tokens)


@dataclass(frozen=True)
class PromptFit:
    """What the vocabulary allows one token to cover; built once for the server's tokenizer."""

    longest_token_bytes: int

    @classmethod
    def of(cls, tokenizer) -> "PromptFit":
        return cls(longest_token_bytes(tokenizer))

    def check(self, text: str, ctx: int) -> None:
        """Refuse a text too long for the context, whatever its tokenization (as build_request refuses
        one of ctx tokens or more, with the least count the bytes prove)."""
        size = len(text.encode("utf-8", "surrogatepass"))  # a lone surrogate from a JSON escape counts too
        if size > ctx * self.longest_token_bytes:
            raise prompt_too_long(f"at least {-(-size // self.longest_token_bytes)}", ctx)
