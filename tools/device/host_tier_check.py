"""The prefix cache's host tier on the GPU (engine/kvcache/host_shelf.py): an eviction's blocks copied to the shelf's
slots, against the earlier way (a gather and a copy to pageable memory a block, each waited for,
KVCache.read_blocks); every block's rows equal after the round trip, f16 and q8_0 pools, on the Llama-3-8B shape's
KV (32 layers, 8 KV heads of 128, blocks of 64: 8 MiB a block in f16): the shelf's page-locked chunks and strided
copies queued on the stream. The shelf makes its chunks ahead (make_ahead: a thread of their own, started here
before the pool is filled, so that its allocations run beside the GPU's work): `made_ahead_s` is the thread's time
and the first pass waits only for chunks not yet made. `queue_s`: the host's time to queue one eviction's copies
(without waiting for them).

Copies ahead (put_ahead, on the shelf's own stream beside the steps): the same 800 blocks queued beside a stand-in for
steps (fp16 matmuls on the current stream), then the tier's fence and the evicted blocks written over at once on the
current stream, as the next step does; every block must come back equal (a missing wait would let the writes race
the copies). `steps_s` / `steps_beside_s`: the matmuls alone and with the copies beside them (the overlap);
`ahead_queue_s`: the host's time to queue the copies ahead.

    python tools/device/host_tier_check.py [--blocks 2048] [--evict 800] [--json OUT]

Exit status 0 when every block came back equal.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from engine.kvcache.kv import KVCache  # noqa: E402
from engine.ops.backend import select_backend  # noqa: E402

SHAPE_8B = SimpleNamespace(kv_layers=32, n_kv_heads=8, head_dim=128)


def timed(backend, fn) -> float:
    backend.synchronize()
    start = time.perf_counter()
    fn()
    backend.synchronize()
    return time.perf_counter() - start


def filled_shelf(kv_type: str, blocks: int, evict: int, seed: int):
    """A pool of `blocks` of the 8B shape's KV filled with distinct rows, a shelf of `evict` slots whose chunks are
    being made ahead, and `evict` of the blocks in a scattered order (an LRU queue's): (backend, kv, shelf, order,
    when the chunks' making began)."""
    backend = select_backend("gpu")
    kv = KVCache(SHAPE_8B, 64 * blocks, backend, 64, blocks, kv_type=kv_type)
    shelf = kv.shelf(evict)
    began = time.perf_counter()
    shelf.make_ahead()
    fill(backend.xp, shelf.pools)
    return backend, kv, shelf, np.random.default_rng(seed).permutation(blocks)[:evict].tolist(), began


def check(kv_type: str, blocks: int, evict: int, repeats: int) -> dict:
    backend, kv, shelf, order, began = filled_shelf(kv_type, blocks, evict, 1)
    cp, parts, slots = backend.xp, shelf.pools, list(range(evict))
    first = timed(backend, lambda: shelf.put(slots, order))  # waits only for chunks not yet made
    shelf.maker.join()
    made_ahead = time.perf_counter() - began
    again = [timed(backend, lambda: shelf.put(slots, order)) for _ in range(repeats)]
    sorted_order = sorted(order)
    runs = [timed(backend, lambda: shelf.put(slots, sorted_order)) for _ in range(repeats)]
    shelf.put(slots, order)
    expect = [cp.asnumpy(part[:, order]).view(np.uint8) for part in parts]  # (bits: a scale may be NaN)
    per_block = [timed(backend, lambda: [kv.read_blocks([b]) for b in order]) for _ in range(repeats)]
    for part in parts:
        part.fill(0)
    target = np.random.default_rng(2).permutation(blocks)[:evict].tolist()
    back = timed(backend, lambda: shelf.get(slots, target))
    equal = all(np.array_equal(cp.asnumpy(part[:, target]).view(np.uint8), rows) for part, rows in zip(parts, expect))
    gib = evict * kv.block_bytes / 2**30
    out = {"kv_type": kv_type, "blocks": evict, "gib": round(gib, 3), "equal": equal,
           "shelf_first_s": round(first, 4), "made_ahead_s": round(made_ahead, 3),
           "shelf_s": round(statistics.median(again), 4),
           "shelf_sorted_s": round(statistics.median(runs), 4), "back_s": round(back, 4),
           "per_block_s": round(statistics.median(per_block), 4),
           "shelf_gib_s": round(gib / statistics.median(again), 1),
           "per_block_gib_s": round(gib / statistics.median(per_block), 2)}
    print(json.dumps(out), flush=True)
    return out


def fill(cp, parts) -> None:
    """Distinct rows in every pool array: hashed bytes, a layer at a time."""
    for p, part in enumerate(parts):
        for layer in range(part.shape[0]):
            raw = part[layer].view(cp.uint8)
            seed = cp.arange(raw.size, dtype=cp.uint32) + np.uint32(((p * 64 + layer) * 0x9E3779B1) & 0xFFFFFFFF)
            raw[:] = ((seed * np.uint32(2654435761)) >> 13).astype(cp.uint8).reshape(raw.shape)


def check_ahead(kv_type: str, blocks: int, evict: int, repeats: int) -> dict:
    backend, kv, shelf, order, _ = filled_shelf(kv_type, blocks, evict, 3)
    cp, parts, slots = backend.xp, shelf.pools, list(range(evict))
    shelf.maker.join()
    a = cp.random.RandomState(0).standard_normal((8192, 8192), dtype=cp.float32).astype(cp.float16)

    def steps():  # ~1.1 TFLOP each: about as long as the copies, 80 of them
        for _ in range(80):
            a @ a

    steps_alone = [timed(backend, steps) for _ in range(repeats)]
    backend.synchronize()
    start = time.perf_counter()
    shelf.put(slots, order)  # (also the warm pass: every chunk touched once)
    queue = time.perf_counter() - start
    expect = [cp.asnumpy(part[:, order]).view(np.uint8) for part in parts]
    beside, queued = [], []
    for _ in range(repeats):
        backend.synchronize()
        start = time.perf_counter()
        shelf.put_ahead(slots, order)
        queued.append(time.perf_counter() - start)
        steps()
        shelf.fence(blocks=order)  # (as the tier's store does before an eviction's blocks are written over)
        for part in parts:  # the evicted blocks written over right after the fence, as the next step's rows would
            part[:, order] = 0
        backend.synchronize()
        beside.append(time.perf_counter() - start)
        fill(cp, parts)
    shelf.put_ahead(slots, order)
    shelf.fence(blocks=order)
    for part in parts:
        part[:, order] = 0
    target = np.random.default_rng(4).permutation(blocks)[:evict].tolist()
    shelf.get(slots, target)
    equal = all(np.array_equal(cp.asnumpy(part[:, target]).view(np.uint8), rows) for part, rows in zip(parts, expect))
    out = {"kv_type": kv_type, "ahead_equal": equal, "queue_s": round(queue, 4),
           "ahead_queue_s": round(statistics.median(queued), 4), "steps_s": round(statistics.median(steps_alone), 4),
           "steps_beside_s": round(statistics.median(beside), 4)}
    print(json.dumps(out), flush=True)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--blocks", type=int, default=2048, help="the pool's blocks")
    p.add_argument("--evict", type=int, default=800, help="blocks evicted at once (the 64 clients' admission)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json")
    a = p.parse_args(argv)
    results = [check(kv_type, a.blocks, a.evict, a.repeats) for kv_type in ("f16", "q8_0")]
    results += [check_ahead(kv_type, a.blocks, a.evict, a.repeats) for kv_type in ("f16", "q8_0")]
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1))
    ok = all(r.get("equal", r.get("ahead_equal")) for r in results)
    print("HOST TIER CHECK " + ("PASSED" if ok else "FAILED"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
