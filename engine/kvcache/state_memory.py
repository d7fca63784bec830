"""Where a GPU's recurrent states live (a hybrid model's: engine/kvcache/recurrent.py): a CuPy memory pool of their
own, its room taken when the engine starts, as the KV pool's is.

Each running request holds two states (75 MiB each on Qwen3-Next-80B) made when it starts, dropped when it ends
and made again on a rewind. Taken from CuPy's default pool, between a prompt step's temporaries of every size, they
split its free chunks and pin them: at 256 clients on an H100 the engine ran out of memory with the states of only
29 requests in it (the plan's room for them given to a larger KV pool on each restart). Here the states' chunks are
all of the states' two sizes, made at start for as many states as the memory plan counts (engine/kvcache/sizing.py
fit_running: two a running request and SPARE_STATES), and reused as states come and go; the default pool never
sees them. A state past those (a plan that fell short) is asked of the device, after the default pool's unused
chunks are handed back to it."""
from __future__ import annotations

from contextlib import contextmanager
from typing import Callable

from engine.kvcache import recurrent
from engine.kvcache.recurrent import RecurrentState

SPARE_STATES = 4  # beside the running requests' two each: the zero state, the decode graphs' padding rows' two,
# and a rewind's copy of its mark made before the state it replaces is dropped


class StateMemory:
    def __init__(self, cp, states: int, make: Callable[[], RecurrentState]):
        """A pool holding `states` of what make() makes (the zero state), installed as where every device state is
        made from now on (RecurrentState's allocations: engine/kvcache/recurrent.py allocate_states_in)."""
        self.cp, self.states = cp, states
        self.pool = cp.cuda.MemoryPool(self.device_malloc)
        with self.allocating():
            held = [make() for _ in range(states)]
        self.held_bytes = sum(s.nbytes for s in held)
        del held  # (their chunks stay in the pool, free for the states to come)
        recurrent.allocate_states_in(self.allocating)

    @contextmanager
    def allocating(self):
        with self.cp.cuda.using_allocator(self.pool.malloc):
            yield

    def device_malloc(self, size: int):
        """The device's memory for a chunk past the states made at start: the default pool's unused chunks handed
        back first (CuPy frees only the pool that ran out's own)."""
        runtime = self.cp.cuda.runtime
        try:
            return self.cp.cuda.memory._malloc(size)
        except runtime.CUDARuntimeError as e:
            if e.status != getattr(runtime, "errorMemoryAllocation", 2):
                raise
        self.cp.get_default_memory_pool().free_all_blocks()
        return self.cp.cuda.memory._malloc(size)

    def describe(self) -> str:
        used, held = self.pool.used_bytes(), self.pool.total_bytes()
        return f"recurrent states {used / 2**30:.2f} of {held / 2**30:.2f} GiB held ({self.states} made at start)"
