"""A request's prompt rendered and tokenized in a worker thread, never on the event loop.

Rendering a long conversation through its template and tokenizing it take seconds for a large
prompt (tokenizing 20 MB: 22 s on the CPU); on the event loop that would stall every other client,
/health included. In a thread the loop stays free, provided the thread lets go of the GIL: Jinja's
rendering is Python (it yields the GIL every few ms), and the tokenizer's encode goes through
`tokenizers`' GIL-free batch call (engine/modelfile/tokenizer.py). The threads are asyncio's default
executor's: a small request's rendering never queues behind a large one's (the body limit,
serve/http/body_limit.py, bounds what any one can cost).
"""
from __future__ import annotations

import asyncio

from engine.modelfile.token_segments import TooManyTokens
from serve.api.chat import ToolPlan, render
from serve.api.errors import APIError, prompt_too_long
from serve.api.prompt_fit import PromptFit


async def off_loop(fn, *args):
    return await asyncio.to_thread(fn, *args)


def check_ids(ids, vocab_size: int, what: str, param: str) -> None:
    """Token ids a client wrote (a tokenizer's need no check: min and max of a 6K-token list took ~0.2 ms of the event
    loop a chat request), each within the vocabulary, else a 400 that says which `what`."""
    if min(ids) < 0 or max(ids) >= vocab_size:
        raise APIError(400, f"{what} token ids must be within the vocabulary", param=param)


def text_tokens(state, fit: PromptFit, text: str) -> list[int]:
    """The prompt's tokens; a text that cannot fit the context is refused before it is tokenized, one that
    does not fit once tokenized before its tokens become a list."""
    fit.check(text, state.ctx)
    try:
        return state.tokenizer.encode(text, limit=state.ctx - 1)
    except TooManyTokens as e:
        raise prompt_too_long(e.tokens, state.ctx) from None


def chat_tokens(state, fit: PromptFit, body, plan: ToolPlan, generation_prompt: bool = True) -> tuple[str, list[int]]:
    """The chat request rendered by the model's template (serve/api/chat.py render), and its tokens."""
    text = render(state, body, plan, generation_prompt)
    return text, text_tokens(state, fit, text)
