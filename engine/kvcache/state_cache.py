"""A hybrid model's prefix cache for its recurrent state (engine/kvcache/recurrent.py): the state at a block
boundary of a prompt, kept under the prefix-cache key of the block that ends there (block_pool.block_key,
which names every token before it). A cached prefix of a hybrid model is reused up to the last boundary
whose state is kept: its attention layers' rows come from the pool's blocks, its linear layers' state
from here, and the read goes on from that state as a cold read would (the state is a read's mark, at
a chunk boundary of the delta rule), so the tokens are a cold read's.

States are kept where a read leaves its mark (the end of each prompt step, and the last whole block of
an answer read again), least recently used first out beyond the byte budget."""
from __future__ import annotations

from collections import OrderedDict

from engine.kvcache.block_pool import ROOT_KEY, block_key
from engine.kvcache.recurrent import RecurrentState

BUDGET_BYTES = 1 << 30  # host memory for kept states (a Qwen3-Next-80B state is ~75 MB: a dozen prefixes)


def chain_keys(prompt, blocks: int, size: int) -> list[bytes]:
    """The keys of the first `blocks` blocks of `prompt`, as the block pool names them."""
    keys, parent = [], ROOT_KEY
    for start in range(0, blocks * size, size):
        parent = block_key(parent, tuple(prompt[start : start + size]))
        keys.append(parent)
    return keys


class StateCache:
    def __init__(self, size: int, budget_bytes: int = BUDGET_BYTES):
        self.size, self.budget = size, budget_bytes  # size: the block pool's positions a block
        self.states: OrderedDict[bytes, RecurrentState] = OrderedDict()
        self.nbytes = self.kept = self.hits = 0

    def keep(self, prompt, at: int, state: RecurrentState) -> None:
        """`state` (copied) is the state after prompt[:at], `at` a block boundary."""
        if at <= 0 or at % self.size:
            return
        key = chain_keys(prompt, at // self.size, self.size)[-1]
        if key in self.states:
            self.states.move_to_end(key)
            return
        self.states[key] = state.copy()
        self.nbytes += state.nbytes
        self.kept += 1
        while self.nbytes > self.budget and self.states:
            _, old = self.states.popitem(last=False)
            self.nbytes -= old.nbytes

    def resume(self, prompt, blocks: int) -> tuple[int, RecurrentState | None]:
        """The most blocks (of the first `blocks` of prompt, which the pool has) after which a state is
        kept, and that state (not a copy); (0, None) if none is."""
        keys = chain_keys(prompt, blocks, self.size)
        for n in range(blocks, 0, -1):
            state = self.states.get(keys[n - 1])
            if state is not None:
                self.states.move_to_end(keys[n - 1])
                self.hits += 1
                return n, state
        return 0, None
