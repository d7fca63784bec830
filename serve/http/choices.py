"""Several answers to one prompt (`n` on chat and completions): one request per choice, each seeded
apart, run side by side and merged into one stream of (choice, event).

The first choice goes into the engine alone; the others follow once it has read the prompt (its
first event past the queue), so that they find the prompt's blocks in the prefix cache instead of
each reading it again beside the others."""
from __future__ import annotations

import asyncio
import hashlib
from contextlib import aclosing
from typing import AsyncIterator

from serve.http.run_request import events
from serve.scheduling.generation import Finished, GenerationError, KeepAlive
from serve.scheduling.request import Request

MAX_CHOICES = 16


def derived_seed(seed: int, choice: int) -> int:
    """Choice 0 keeps the request's seed (n=1 answers as before); the others' come from it, each its
    own and the same on every run."""
    if choice == 0:
        return seed
    digest = hashlib.blake2b(f"{seed}:{choice}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") % 2**63


def siblings(req: Request, n: int) -> list[Request]:
    """req and n - 1 copies of it, each a request of its own (a greedy one answers the same n times)."""
    out = [req]
    for i in range(1, n):
        sampling = dict(req.sampling)
        if "seed" in sampling:
            sampling["seed"] = derived_seed(sampling["seed"], i)
        out.append(Request(prompt=req.prompt, max_tokens=req.max_tokens, sampling=sampling, stop=req.stop,
                           stream=req.stream, priority=req.priority))
    return out


async def merged(state, reqs: list[Request]) -> AsyncIterator[tuple[int, object]]:
    """(choice, event) as they come: keep-alives (of the first choice only), pieces, and each choice's
    Finished; a GenerationError of any choice ends them all. Leaving early (the client gone) cancels
    every choice still running, which frees the engine of them."""
    if len(reqs) == 1:  # one answer: its events as they are, without a task and a queue between (a hop per token)
        async with aclosing(events(state, reqs[0])) as answer:  # (closed early: the answer's end frees the engine)
            async for event in answer:
                yield 0, event
        return
    queue: asyncio.Queue = asyncio.Queue()
    prompt_read = asyncio.Event()

    async def pump(i: int, req: Request) -> None:
        try:
            if i:
                await prompt_read.wait()
            async for event in events(state, req):
                if not isinstance(event, KeepAlive):
                    prompt_read.set()
                if i == 0 or not isinstance(event, KeepAlive):
                    await queue.put((i, event))
        except GenerationError as e:
            await queue.put((i, e))
        finally:
            prompt_read.set()  # (a first choice that failed lets the others try)

    tasks = [asyncio.ensure_future(pump(i, req)) for i, req in enumerate(reqs)]
    try:
        left = len(reqs)
        while left:
            i, event = await queue.get()
            if isinstance(event, GenerationError):
                raise event
            left -= isinstance(event, Finished)
            yield i, event
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
