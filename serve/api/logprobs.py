"""Log-probabilities in the APIs' shapes, from the engine's T lines (protocol/messages.py Token: the
token's log-probability and the N likeliest, under the logits the draw read: after the penalties and
the grammar's mask, before the temperature and the top-k / top-p / min-p cuts).

A token's text is its own bytes read as UTF-8 (a token that holds part of a character shows U+FFFD,
its `bytes` say exactly what it holds), as OpenAI gives them."""
from __future__ import annotations

from protocol import messages as m


def _entry(tokenizer, token: int, logprob: float) -> dict:
    raw = tokenizer.token_bytes(token)
    return {"token": raw.decode("utf-8", errors="replace"), "logprob": logprob, "bytes": list(raw)}


def chat_logprobs(tokenizer, tokens: list[m.Token]) -> dict:
    """Chat completions' (and the Responses API's) `logprobs`: one entry per answer token, each with
    its `top_logprobs` (as many as the request's top_logprobs)."""
    return {"content": [_entry(tokenizer, t.token, t.logprob)
                        | {"top_logprobs": [_entry(tokenizer, i, lp) for i, lp in t.top]} for t in tokens],
            "refusal": None}


def completion_logprobs(tokenizer, tokens: list[m.Token], offset: int = 0) -> dict:
    """The legacy completions' `logprobs`: parallel lists of the tokens' texts, their log-probabilities,
    the top candidates of each as {text: logprob}, and where each token's text starts in the answer
    (counted from `offset`, the characters before it: an echoed prompt's, or earlier stream chunks'). An
    echoed prompt's tokens come first, the first with None for its log-probability and its top."""
    texts = [_entry(tokenizer, t.token, 0.0)["token"] for t in tokens]
    starts, at = [], offset
    for text in texts:
        starts.append(at)
        at += len(text)
    return {"tokens": texts, "token_logprobs": [t.logprob for t in tokens],
            "top_logprobs": [None if t.logprob is None else {_entry(tokenizer, i, 0.0)["token"]: lp for i, lp in t.top}
                             for t in tokens],
            "text_offset": starts}
