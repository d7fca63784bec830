"""The expert cache's bookkeeping (engine/ops/expert_cache.py) with NumPy as the device: every chosen expert's
rows are in the slot its choice is renamed to, the least recently used slot a step does not want goes first,
a step that wants more experts than the cache holds at once is refused (its rows go in runs that fit), and on the CPU
the cached mixture gives the resident experts' bits. (Its bits on the GPU's kernels:
tests/engine/kernels/test_expert_cache_host.py.)"""
import numpy as np
import pytest

from engine.core.experts import Experts, ExpertStack
from engine.core.quantized import Row8
from engine.ops.backend import ArrayOps
from engine.kernels.args import address
from engine.ops.expert_cache import ExpertCache
from tests.engine.kernels.host_gpu import HostCupy

EXPERTS, ROWS, COLS = 6, 4, 3


def cache(slots: int, xp=np, swaps: int | None = None) -> ExpertCache:
    rng = np.random.default_rng(0)
    stacks = [ExpertStack("F32", rng.standard_normal((EXPERTS * r, c)).astype(np.float32), EXPERTS, r, c)
              for r, c in ((ROWS, COLS), (ROWS, COLS), (COLS, ROWS))]
    return ExpertCache(xp, Experts(*stacks), slots, 2, swaps)


def holds(c: ExpertCache, chosen, slots) -> bool:
    return all(np.array_equal(d.expert(s), h.expert(e))
               for e, s in zip(np.ravel(chosen), np.ravel(slots))
               for d, h in zip((c.device.gate, c.device.up, c.device.down), (c.host.gate, c.host.up, c.host.down)))


def test_choices_are_renamed_to_slots_holding_those_experts_least_recently_used_out_first():
    c = cache(3)  # experts 0, 1, 2 in the slots from the start
    assert list(c.expert_in) == [0, 1, 2] and holds(c, [0, 1, 2], c.slot_of[[0, 1, 2]])
    first = np.array([[3, 0]])  # 3 takes the slot of 1 (the first of those this step does not want)
    assert holds(c, first, c.slots_for(first)) and c.slot_of[1] == -1 and (c.counts.misses, c.counts.hits) == (1, 1)
    second = np.array([[2, 4], [2, 2]])  # 4 takes the slot of 0 or 3, last used a step ago; never 2's
    assert holds(c, second, c.slots_for(second)) and c.slot_of[2] >= 0 and (c.counts.misses, c.counts.hits) == (2, 2)
    with pytest.raises(ValueError, match="wants 4 experts"):  # four experts for three slots
        c.slots_for(np.array([[1, 5], [4, 2]]))
    assert c.counts.misses == 2 and c.counts.bytes_copied == 2 * 4 * (2 * ROWS * COLS + COLS * ROWS)


def test_a_step_s_rows_go_in_runs_of_consecutive_rows_whose_experts_fit():
    c = cache(3)
    picks = np.array([[0, 1], [1, 2], [3, 4], [4, 5], [0, 5], [2, 2]])
    runs = c.runs(picks)
    assert np.array_equal(np.concatenate([np.arange(len(picks))[r] for r in runs]), np.arange(len(picks)))
    assert all(len(np.unique(picks[r])) <= 3 for r in runs) and len(runs) == 3
    placed = [(rows, slots.copy()) for rows, slots in c.placed(picks)]  # each run's slots right after its copies
    assert [rows for rows, _ in placed] == runs and c.counts.tokens == len(picks)
    assert all(np.array_equal(c.expert_in[slots], picks[rows]) for rows, slots in placed[-1:])


def test_on_the_cpu_the_cached_mixture_gives_the_resident_bits_and_counts():
    """ArrayOps.mixture over an ExpertCache (--expert-slots on the CPU): the same bits as the resident experts for
    a chunk whose rows want more experts than the cache holds, and a decode row's."""
    rng = np.random.default_rng(1)
    experts = Experts(*(ExpertStack("F32", rng.standard_normal((EXPERTS * r, c)).astype(np.float32), EXPERTS, r, c)
                        for r, c in ((ROWS, COLS), (ROWS, COLS), (COLS, ROWS))))
    ops, router = ArrayOps(np), rng.standard_normal((EXPERTS, COLS)).astype(np.float32)
    c = ExpertCache(np, experts, 3, 2)
    for rows in (9, 1):
        h = rng.standard_normal((rows, COLS)).astype(np.float32)
        resident, chosen, _ = ops.mixture(h, router, experts, 2, True)
        cached, chosen_too, _ = ops.mixture(h, router, c, 2, True)
        assert np.array_equal(resident, cached) and np.array_equal(chosen, chosen_too)
        assert rows == 1 or len(c.runs(chosen)) > 1  # the chunk's rows went in several runs
    assert c.counts.tokens == 10 and c.counts.misses > 0


def rows_through(stacks: Experts, h, at, weights):
    """Each row's experts (at: their places in stacks) summed in choice order, as moe.cu's decode sums them."""
    out = np.zeros(h.shape, dtype=np.float32)
    for r, (row, places) in enumerate(zip(h, at)):
        for j, e in enumerate(places):
            gate, up = stacks.gate.expert(e) @ row, stacks.up.expert(e) @ row
            out[r] += weights[r, j] * (stacks.down.expert(e) @ (gate / (1 + np.exp(-gate)) * up))
    return out.astype(np.float16)


class Chosen(np.ndarray):
    def get(self):  # a CuPy array's copy to the host
        return np.asarray(self)


class HostMoe:
    """moe.cu's launches as the cache calls them (engine/kernels/moe_launch.py): route's given choices as a device
    array; decode's stacks recorded (the kernels' bits through the tables: tests/engine/kernels/
    test_expert_cache_host.py)."""

    def __init__(self, chosen, weights):
        self.chosen, self.weights, self.read = chosen.view(Chosen), weights, None

    def route(self, values, router, k, normalize, decode=False):
        return self.chosen, self.weights

    def decode(self, h, experts, chosen, weights):
        self.read = experts
        return np.zeros(h.values.shape, dtype=np.float16)


def test_a_decode_step_reads_through_the_tables_and_the_refill_brings_the_most_used_experts_in():
    """On a GPU (NumPy as CuPy here: HostCupy) a decode step reads each expert where its table says, its routes
    kept; after it the experts it read from host memory come into the slots of the least used, `swaps` a step,
    and the tables follow."""
    c = cache(3, xp=HostCupy(), swaps=1)  # experts 0, 1, 2 in the slots
    size = c.host.gate.expert_bytes

    def where() -> list[str]:
        base = address(c.device.gate.data)
        return [f"slot {(at - base) // size}" if 0 <= at - base < c.slots * size else "host"
                for at in c.mapped.gate.table.tolist()]

    assert where() == ["slot 0", "slot 1", "slot 2", "host", "host", "host"]
    h = np.zeros((1, COLS), dtype=np.float32)
    seen = []
    for _ in range(3):  # three steps of one row routed to experts 4 and 5
        moe = HostMoe(np.array([[4, 5]]), np.ones((1, 2), np.float32))
        c.mixture(moe, Row8(h, None), h, None, 2, True, True)
        assert moe.read is c.mapped
        c.refill(1)
        seen.append(where())
    assert seen[0] == ["host", "slot 1", "slot 2", "host", "slot 0", "host"]  # 4 for 0 (the first of the ties)
    assert seen[1] == seen[2] == ["host", "host", "slot 2", "host", "slot 0", "slot 1"]  # then 5 for 1
    assert (c.counts.misses, c.counts.hits, c.counts.tokens) == (3, 3, 3)  # 4 and 5 from host, then 5, then none
    assert c.counts.bytes_copied == 2 * sum(s.expert_bytes for s in (c.host.gate, c.host.up, c.host.down))
