"""The expert cache's bookkeeping (engine/ops/expert_cache.py) with NumPy as the device: every chosen expert's
rows are in the slot its choice is renamed to, the least recently used slot a step does not want goes first,
and a step that wants more experts than the cache holds is refused. (Its bits on the GPU's kernels:
tests/engine/kernels/test_expert_cache_host.py.)"""
import numpy as np
import pytest

from engine.core.experts import Experts, ExpertStack
from engine.ops.expert_cache import ExpertCache

EXPERTS, ROWS, COLS = 6, 4, 3


def cache(slots: int) -> ExpertCache:
    rng = np.random.default_rng(0)
    stacks = [ExpertStack("F32", rng.standard_normal((EXPERTS * r, c)).astype(np.float32), EXPERTS, r, c)
              for r, c in ((ROWS, COLS), (ROWS, COLS), (COLS, ROWS))]
    return ExpertCache(np, Experts(*stacks), slots)


def holds(c: ExpertCache, chosen, slots) -> bool:
    return all(np.array_equal(d.expert(s), h.expert(e))
               for e, s in zip(np.ravel(chosen), np.ravel(slots))
               for d, h in zip((c.device.gate, c.device.up, c.device.down), (c.host.gate, c.host.up, c.host.down)))


def test_choices_are_renamed_to_slots_holding_those_experts_least_recently_used_out_first():
    c = cache(3)
    first = np.array([[0, 1], [1, 2]])
    assert holds(c, first, c.slots_for(first)) and (c.counts.misses, c.counts.hits) == (3, 0)
    second = np.array([[2, 4]])  # 4 takes the slot of 0, the least recently used (1 and 2 were used with it)
    slots = c.slots_for(second)
    assert holds(c, second, slots) and c.slot_of[0] == -1 and c.slot_of[1] >= 0 and c.counts.hits == 1
    third = np.array([[1, 5], [4, 2]])  # four experts for three slots: refused
    with pytest.raises(ValueError, match="wants 4 experts"):
        c.slots_for(third)
    fourth = np.array([[1, 5]])  # 5 takes the slot of 2 or 4 (both last used by `second`): not 1's
    assert holds(c, fourth, c.slots_for(fourth)) and c.slot_of[1] >= 0 and c.counts.misses == 5


def test_a_prompt_chunk_s_rows_go_in_groups_whose_experts_fit():
    c = cache(3)
    picks = np.array([[0, 1], [1, 2], [3, 4], [4, 5], [0, 5], [2, 2]])
    groups = c.groups(picks)
    assert np.array_equal(np.concatenate(groups), np.arange(len(picks)))  # every row once, in order
    assert all(len(np.unique(picks[g])) <= 3 for g in groups) and len(groups) == 3
