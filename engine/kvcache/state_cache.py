"""A hybrid model's prefix cache for its recurrent state (engine/kvcache/recurrent.py): the state at a block
boundary of a prompt, kept under the prefix-cache key of the block that ends there (the block pool's key,
which names every token before it). A cached prefix of a hybrid model is reused up to the last boundary
whose state is kept: its attention layers' rows come from the pool's blocks, its linear layers' state
from here, and the read goes on from that state as a cold read would (the state is a read's mark, at
a chunk boundary of the delta rule), so the tokens are a cold read's.

States are kept where a read leaves its mark (the end of each prompt step, and the last whole block of
an answer read again), least recently used first out beyond the byte budget."""
from __future__ import annotations

from collections import OrderedDict

import numpy as np

from engine.kvcache.recurrent import RecurrentState

BUDGET_BYTES = 1 << 30  # host memory for kept states (a Qwen3-Next-80B state is ~75 MB: a dozen prefixes)


class StateCache:
    def __init__(self, size: int, budget_bytes: int = BUDGET_BYTES):
        self.size, self.budget = size, budget_bytes  # size: the block pool's positions a block
        self.states: OrderedDict[bytes, RecurrentState] = OrderedDict()
        self.nbytes = 0

    def keep(self, keys: list[bytes], at: int, state: RecurrentState) -> None:
        """`state` (copied to the host) is the state after position `at` - 1 of the prompt whose blocks' chain keys are
        `keys` (BlockPool.register's); kept if `at` ends one of those blocks."""
        if at <= 0 or at % self.size or at // self.size > len(keys):
            return
        key = keys[at // self.size - 1]
        if key in self.states:
            self.states.move_to_end(key)
            return
        self.states[key] = state.copy(np)  # in host memory, whatever the backend
        self.nbytes += state.nbytes
        while self.nbytes > self.budget and self.states:
            _, old = self.states.popitem(last=False)
            self.nbytes -= old.nbytes

    def resume(self, keys: list[bytes]) -> tuple[int, RecurrentState | None]:
        """Of the cached blocks whose chain keys are `keys` (a prefix the pool found), the most after
        which a state is kept, and that state (not a copy); (0, None) if none is."""
        for n in range(len(keys), 0, -1):
            state = self.states.get(keys[n - 1])
            if state is not None:
                self.states.move_to_end(keys[n - 1])
                return n, state
        return 0, None
