"""When a GPU engine keeps its prompt weights expanded (engine/kvcache/prompt_weights.py): the rule's numbers. That
the kept expansions give the per-step expansion's bits is checked on the device (tools/device/prompt_weights_check.py):
on the CPU the weights are float32 already and nothing is expanded at a step."""
from __future__ import annotations

import pytest

from engine.kvcache.prompt_weights import KEEP_SHARE, Room, keep_expanded

GIB = 1 << 30
H100_8B = Room(free=73 * GIB, beside=20 * GIB)  # an 8B Q4_K_M on an 80 GB card: 13 GiB of expansions, its KV for 131K


def test_auto_keeps_them_where_they_take_a_quarter_of_the_room_at_most_and_the_longest_request_still_fits():
    assert keep_expanded("auto", 13 * GIB, H100_8B)
    assert keep_expanded("auto", 73 * GIB // KEEP_SHARE, H100_8B)
    assert not keep_expanded("auto", 73 * GIB // KEEP_SHARE + 1, H100_8B)  # a 24 GB card's share is far less
    assert not keep_expanded("auto", 13 * GIB, Room(free=73 * GIB, beside=61 * GIB))  # a --ctx that needs the room


def test_auto_leaves_a_hybrids_room_to_its_states_and_several_gpus_alone():
    assert not keep_expanded("auto", 13 * GIB, H100_8B, stateful=True)
    assert not keep_expanded("auto", 13 * GIB, H100_8B, tp=2)


def test_resident_keeps_them_whatever_the_room_and_per_step_never():
    assert keep_expanded("resident", 60 * GIB, Room(free=61 * GIB, beside=20 * GIB), stateful=True)
    assert not keep_expanded("per-step", 1, H100_8B)
    assert not keep_expanded("resident", 0, H100_8B)  # nothing quantized to keep


def test_an_unknown_mode_is_refused_by_name():
    with pytest.raises(ValueError, match="--prompt-weights must be one of auto, resident, per-step"):
        keep_expanded("always", GIB, H100_8B)
