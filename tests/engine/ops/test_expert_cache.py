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
    c = cache(3)  # experts 0, 1, 2 in the slots from the start
    assert list(c.expert_in) == [0, 1, 2] and holds(c, [0, 1, 2], c.slot_of[[0, 1, 2]])
    first = np.array([[3, 0]])  # 3 takes the slot of 1 (the first of those this step does not want)
    assert holds(c, first, c.slots_for(first)) and c.slot_of[1] == -1 and (c.counts.misses, c.counts.hits) == (1, 1)
    second = np.array([[2, 4], [2, 2]])  # 4 takes the slot of 0 or 3, last used a step ago; never 2's
    assert holds(c, second, c.slots_for(second)) and c.slot_of[2] >= 0 and (c.counts.misses, c.counts.hits) == (2, 2)
    with pytest.raises(ValueError, match="wants 4 experts"):  # four experts for three slots
        c.slots_for(np.array([[1, 5], [4, 2]]))
    assert c.counts.misses == 2 and c.counts.bytes_copied == 2 * 4 * (2 * ROWS * COLS + COLS * ROWS)


def test_a_prompt_chunk_s_rows_go_in_groups_whose_experts_fit():
    c = cache(3)
    picks = np.array([[0, 1], [1, 2], [3, 4], [4, 5], [0, 5], [2, 2]])
    groups = c.groups(picks)
    assert np.array_equal(np.concatenate(groups), np.arange(len(picks)))  # every row once, in order
    assert all(len(np.unique(picks[g])) <= 3 for g in groups) and len(groups) == 3
