"""On a GPU: a hybrid's recurrent states come from their own pool (engine/kvcache/state_memory.py), made at start.
States made and dropped as requests come and go, between temporaries of odd sizes in CuPy's default pool, take no
new device memory and leave none of the default pool's chunks pinned; a state past those made at start is made
all the same; a state parked in host memory and brought back comes from the pool too.
    python3 tools/device/state_memory_check.py [--json PATH]   (the 80B-A3B shape's states: 36 layers, 75 MiB)"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import cupy as cp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # (run as a script from the repository's root)
from engine.kvcache.recurrent import RecurrentState, SequenceState  # noqa: E402
from engine.kvcache.state_memory import StateMemory  # noqa: E402

LAYERS, KERNEL, CHANNELS, HEADS, DK, DV = 36, 4, 8192, 32, 128, 128  # Qwen3-Next-80B's linear layers


def make() -> RecurrentState:
    return RecurrentState.zeros(LAYERS, KERNEL, CHANNELS, HEADS, DK, DV, cp)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--states", type=int, default=12)
    p.add_argument("--json")
    a = p.parse_args()
    arrays = cp.get_default_memory_pool()
    arrays.free_all_blocks()
    before = arrays.total_bytes()
    memory = StateMemory(cp, a.states, make)
    one = make().nbytes
    checks = {"made at start": memory.pool.total_bytes() >= a.states * one and arrays.total_bytes() == before}
    held = memory.pool.total_bytes()
    rng = np.random.default_rng(0)
    for round_ in range(20):  # requests coming and going beside a step's temporaries of every size
        live = [SequenceState.fresh(make()) for _ in range(a.states // 2 - 1)]
        scratch = [cp.empty(int(rng.integers(1, 200)) << 20, cp.uint8) for _ in range(8)]
        live[0].now.ssm += 1
        live[0].now_at = 1
        live[0].rewind()  # (a copy of the mark made before the state it replaces is dropped)
        del scratch, live
    checks["no new memory as states come and go"] = memory.pool.total_bytes() == held
    arrays.free_all_blocks()
    checks["the default pool's chunks all handed back"] = arrays.total_bytes() == before
    parked = SequenceState.fresh(make())
    parked.now.ssm.fill(3)
    back = parked.on(np).on(cp)
    checks["a parked state back from the host, from the pool"] = (bool((back.now.ssm == 3).all())
                                                                   and memory.pool.total_bytes() == held)
    del parked, back
    extra = [make() for _ in range(a.states + 1)]
    checks["a state past those made at start"] = memory.pool.total_bytes() > held and len(extra) == a.states + 1
    result = {"state_bytes": one, "states": a.states, "checks": checks, "ok": all(checks.values()),
              "report": memory.describe()}
    print(json.dumps(result))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
