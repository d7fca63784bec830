"""A regular Lark grammar as one regex, for a custom tool whose input follows a grammar (Codex's
apply_patch). The input travels inside a JSON string in most call formats; llguidance enforces a
JSON schema string's `pattern` on the string's text with the JSON escapes handled, but a Lark
grammar cannot be nested in a JSON string. A grammar with no recursion and no %ignore describes a
regular language, and so fits in a pattern: every rule and terminal is inlined into the start rule.

The grammar text is parsed by the `lark` package (its own grammar loader, so every Lark spelling it
accepts is read the same way); the regex is written in the syntax llguidance reads (Rust's regex
crate: the same as Python's for what Lark grammars use).
"""
from __future__ import annotations

import functools
import re

from lark import Token, Tree
from lark.grammar import Symbol
from lark.exceptions import GrammarError, LarkError
from lark.load_grammar import GrammarBuilder, PatternRE, _literal_to_pattern  # lark's own literal reader


class NotRegular(ValueError):
    """The grammar recurses or skips text (%ignore): it does not fit in one regex."""


@functools.lru_cache(maxsize=64)
def lark_to_regex(grammar: str, start: str = "start") -> str:
    """The whole-input regex (anchored) of a Lark grammar; ValueError if the text is not a grammar,
    NotRegular if it is one that no regex describes. Cached: Codex sends the same apply_patch
    grammar with every turn."""
    builder = GrammarBuilder()
    try:
        builder.load_grammar(grammar, "<tool grammar>")
        built = builder.build()
    except (LarkError, GrammarError) as e:
        raise ValueError(f"not a Lark grammar: {e}") from None
    if built.ignore:
        raise NotRegular("the grammar skips text with %ignore")
    rules = {name: tree for name, _params, tree, _options in built.rule_defs}
    rules.update({name: tree for name, (tree, _priority) in built.term_defs})
    if start not in rules:
        raise ValueError(f"the grammar has no {start!r} rule")
    return "^" + Inliner(rules).regex(start) + "$"


class Inliner:
    def __init__(self, rules: dict[str, Tree]):
        self.rules, self.open, self.done = rules, [], {}

    def regex(self, name: str) -> str:
        if name in self.open:
            raise NotRegular(f"the rule {name!r} refers to itself")
        if name not in self.done:
            if name not in self.rules:
                raise ValueError(f"the grammar uses {name!r} and never defines it")
            self.open.append(name)
            self.done[name] = self.node(self.rules[name])
            self.open.pop()
        return self.done[name]

    def node(self, node) -> str:
        if isinstance(node, Symbol):  # a rule or terminal named where it is used
            return self.regex(node.name)
        kind, kids = node.data, node.children
        if kind == "expansions":
            return group("|".join(self.node(k) for k in kids)) if len(kids) > 1 else self.node(kids[0])
        if kind == "expansion":
            return "".join(self.node(k) for k in kids)
        if kind == "alias":  # `item -> name`: the name is for trees, not for text
            return self.node(kids[0])
        if kind == "value":
            return self.node(kids[0])
        if kind == "maybe":
            return group(self.node(kids[0])) + "?"
        if kind == "expr":
            inner = group(self.node(kids[0]))
            if len(kids) == 2:
                return inner + kids[1].value  # ?, * or +
            low, high = int(kids[2]), int(kids[3]) if len(kids) > 3 else int(kids[2])  # item ~ low [.. high]
            return inner + (f"{{{low}}}" if low == high else f"{{{low},{high}}}")
        if kind == "literal":
            return literal(kids[0])
        if kind == "range":
            first, last = (_literal_to_pattern(k).value for k in kids)
            return f"[{re.escape(first)}-{re.escape(last)}]"
        raise NotRegular(f"the grammar uses {kind!r}, which this reader does not turn into a regex")


def literal(token: Token) -> str:
    pattern = _literal_to_pattern(token)
    body = pattern.value if isinstance(pattern, PatternRE) else escape(pattern.value)
    flags = "".join(sorted(pattern.flags))
    return f"(?{flags}:{body})" if flags else group(body)


def escape(text: str) -> str:
    """A literal as regex text: the metacharacters escaped, nothing else (the Rust regex crate refuses
    escapes of characters that are not metacharacters, such as a space)."""
    return "".join("\\" + c if c in r"\.+*?()|[]{}^$#&-~" else c for c in text)


def group(regex: str) -> str:
    return f"(?:{regex})"
