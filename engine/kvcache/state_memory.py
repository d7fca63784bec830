"""Where a GPU's recurrent states live (a hybrid model's: engine/kvcache/recurrent.py): a CuPy memory pool of their
own, its room taken when the engine starts, as the KV pool's is.

Each running request holds two states (75 MiB each on Qwen3-Next-80B), made when it starts, dropped when it ends,
made again on a rewind; so do an answer read again for the prefix cache and a read parked in place. At 256 clients
on an H100 the engine ran out of memory with 93 requests in it, and again with 69 (the pool held the states of 106,
the answers read again uncounted by the plan), 51, ...: each restart gave the fewer requests' room to a larger KV
pool. Here the states' chunks, of the states' two sizes, are made at start for as many as the memory plan counts
(engine/kvcache/sizing.py fit_running, states_made: two a running request, an answer read again counted as one, two
a parked read, and SPARE_STATES), and reused as states come and go, never split by a step's temporaries in CuPy's
default pool; the pool's figures say how many there are. A state past those (a plan that fell short) is asked of
the device, after the default pool's unused chunks are handed back to it."""
from __future__ import annotations

import sys
from contextlib import contextmanager
from typing import Callable

from engine.kvcache import recurrent
from engine.kvcache.recurrent import RecurrentState

PARKED_READS = 4  # parked reads at a time by default (engine/loop/park_policy.py max_parked): parked in place, a
# read keeps its two states on the device
SPARE_STATES = 4  # beside the running requests' two each (--max-running counts the answers read again too:
# engine/loop/admission.py state_room) and the parked reads': the zero state, the decode graphs' padding rows' two,
# a rewind's copy of its mark made before the state it replaces is dropped


def states_made(running: int, parked: int = PARKED_READS) -> int:
    """The states a hybrid's engine makes at start: two for each running request and parked read, and the spare."""
    return 2 * (running + parked) + SPARE_STATES


class StateMemory:
    def __init__(self, cp, states: int, make: Callable[[], RecurrentState]):
        """A pool holding `states` of what make() makes (the zero state), installed as where every device state is
        made from now on (RecurrentState's allocations: engine/kvcache/recurrent.py allocate_states_in)."""
        self.cp, self.states = cp, states
        self.pool = cp.cuda.MemoryPool(self.device_malloc)
        self.past: int | None = None  # chunks asked of the device after those made at start (None while they are made)
        with self.allocating():
            held = [make() for _ in range(states)]
        del held  # (their chunks stay in the pool, free for the states to come)
        self.past = 0
        recurrent.allocate_states_in(self.allocating)

    @contextmanager
    def allocating(self):
        with self.cp.cuda.using_allocator(self.pool.malloc):
            yield

    def device_malloc(self, size: int):
        """The device's memory for a chunk past the states made at start: the default pool's unused chunks handed
        back first (CuPy frees only the pool that ran out's own)."""
        if self.past is not None:
            self.past += 1
            print(f"strata: a recurrent state's chunk ({size / 2**20:.1f} MiB) past the {self.states} states made at start "
                  f"({self.past} so far): more states live than the memory plan counted", file=sys.stderr, flush=True)
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
