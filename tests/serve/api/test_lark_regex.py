"""serve/api/lark_regex.py: a regular Lark grammar as one regex. The regex (run by Python's re) must
accept exactly what the grammar accepts, as llguidance's own Lark parser reads the grammar (lark's
parser refuses grammars with terminals that may be empty, which apply_patch's has), fed one byte per
token by a byte-level tokenizer."""
from __future__ import annotations

import functools
import re

import llguidance
import pytest
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
from hypothesis import given, settings
from hypothesis import strategies as st

from serve.api.lark_regex import NotRegular, lark_to_regex
from tests.harness import ROOT

APPLY_PATCH = (ROOT / "tests/fixtures/apply_patch.lark").read_text()

PATCHES = [
    "*** Begin Patch\n*** Add File: hello.txt\n+Hello\n+world\n*** End Patch\n",
    "*** Begin Patch\n*** Delete File: old.py\n*** End Patch",
    "*** Begin Patch\n*** Update File: a.py\n*** Move to: b.py\n@@ def f():\n-    return 1\n+    return 2\n"
    "*** End of File\n*** End Patch\n",
    "*** Begin Patch\n*** Update File: a.py\n@@\n x = 1\n-y = 2\n+y = 3\n*** Add File: c.md\n+# c\n*** End Patch\n",
]
NOT_PATCHES = [
    "", "hello", "*** Begin Patch\n*** End Patch\n",  # no hunk
    "*** Begin Patch\n*** Add File: a\n*** End Patch\n",  # an added file needs lines
    "*** Begin Patch\n*** Update File: a.py\n?x\n*** End Patch\n",  # a change line starts with + - or space
    "*** Begin Patch\n*** Delete File: a\n",  # no end
    "** Begin Patch\n*** Delete File: a\n*** End Patch\n",
]


@functools.cache
def byte_tokenizer() -> tuple[Tokenizer, llguidance.LLTokenizer]:
    """A tokenizer whose tokens are the 256 bytes (and an end token), and llguidance's view of it."""
    vocab = {ch: i for i, ch in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    vocab["<end>"] = len(vocab)
    tk = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tk.decoder = decoders.ByteLevel()
    tk.add_special_tokens([AddedToken("<end>", special=True)])
    return tk, llguidance.LLTokenizer(tk.to_str(), n_vocab=len(vocab), eos_token=vocab["<end>"])


def parses(grammar: str, text: str) -> bool:
    tk, lltk = byte_tokenizer()
    matcher = llguidance.LLMatcher(lltk, llguidance.LLMatcher.grammar_from_lark(grammar), log_level=0)
    return all(matcher.consume_token(t) for t in tk.encode(text).ids) and matcher.is_accepting()


def agree(grammar: str, text: str) -> bool:
    """Whether the regex and llguidance's Lark parser say the same of the text (and what they say)."""
    parsed = parses(grammar, text)
    matched = re.fullmatch(lark_to_regex(grammar)[1:-1], text) is not None
    assert matched == parsed, (text, matched, parsed)
    return matched


@pytest.mark.parametrize("text", PATCHES)
def test_apply_patch_patches_match(text):
    assert agree(APPLY_PATCH, text)


@pytest.mark.parametrize("text", NOT_PATCHES)
def test_what_is_not_a_patch_does_not_match(text):
    assert not agree(APPLY_PATCH, text)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(["*** Begin Patch\n", "*** End Patch\n", "*** Add File: x\n", "+a\n", "-b\n", " c\n",
                                 "@@\n", "@@ f\n", "*** Update File: y\n", "*** Delete File: z\n", "*** End of File\n",
                                 "*** Move to: w\n", "\n", "+", "*"]), max_size=8))
def test_the_regex_and_lark_agree_on_any_line_soup(lines):
    agree(APPLY_PATCH, "".join(lines))


def test_operators_ranges_flags_and_repeats():
    grammar = 'start: DIGIT~2..3 ["x"] WORD+ | "q"i\nDIGIT: "0".."9"\nWORD: /[a-z]+ /\n'
    for text in ["12abc ", "123xab cd ", "Q", "q", "1abc ", "1234abc ", "12"]:
        agree(grammar, text)


def test_recursion_and_skipped_text_do_not_fit_in_a_regex():
    with pytest.raises(NotRegular, match="refers to itself"):
        lark_to_regex('start: "(" start ")" | "x"\n')
    with pytest.raises(NotRegular, match="%ignore"):
        lark_to_regex('start: "a" "b"\n%ignore " "\n')


def test_a_broken_grammar_is_a_value_error():
    with pytest.raises(ValueError, match="not a Lark grammar"):
        lark_to_regex("start: (")
    with pytest.raises(ValueError, match="no 'start' rule"):
        lark_to_regex('begin: "a"\n')
