"""Several engines behind one server (--engines N, --gpus 0,1,...): which engine a request runs on.

Each engine has its own Scheduler (serve/scheduling/scheduler.py: its queue, admission by its KV pool,
preemption, crash recovery), and this router stands where the one scheduler stood for the HTTP
side. A request goes, when it arrives, to the engine whose prefix cache most likely holds the start
of its prompt (the server remembers, per engine, the chained hashes of the prompts' blocks it sent
there, as an approximate radix tree: SGLang's cache-aware routing), unless that engine is loaded
well beyond the least loaded one; with no such engine, to the least loaded (waiting, running and
parked requests; then free KV blocks). An engine that is not ready takes nothing new while another
is. When an engine dies, what it held goes back to the front of its queue (Scheduler), and the
router then moves those waiters to a live engine if there is one; the dead engine's prefix record
is dropped (its cache went with it).
"""
from __future__ import annotations

import hashlib
from collections import OrderedDict

import numpy as np

from serve.scheduling.metrics import REUSE_KEYS, experts_together, reuse_summary
from serve.scheduling.request import Request
from serve.scheduling.scheduler import Scheduler

PREFIX_BLOCK = 64  # tokens per hashed block: the engine's default KV block
PREFIX_ENTRIES = 1 << 17  # blocks remembered per engine (least recently used first out)
BALANCE_SLACK = 2  # prefix affinity holds while its engine's load <= 2 x the least load + this


def block_chain(prompt: list[int], block: int = PREFIX_BLOCK) -> list[bytes]:
    """The prompt's whole blocks as chained hashes: hash i names blocks 0..i together."""
    data = np.asarray(prompt, dtype=np.int32).tobytes()
    step, h, out = 4 * block, b"", []
    for start in range(0, len(data) - step + 1, step):
        h = hashlib.blake2b(data[start:start + step], key=h, digest_size=16).digest()
        out.append(h)
    return out


class PrefixRecord:
    """The blocks of prompts sent to one engine, by their chained hashes, most recent last."""

    def __init__(self, capacity: int = PREFIX_ENTRIES):
        self.capacity = capacity
        self.blocks: OrderedDict[bytes, None] = OrderedDict()

    def matched(self, chain: list[bytes]) -> int:
        """Leading whole blocks of a prompt (its block_chain) this engine was sent before."""
        n = 0
        for h in chain:
            if h not in self.blocks:
                break
            n += 1
        return n

    def add(self, chain: list[bytes]) -> None:
        for h in chain:
            self.blocks[h] = None
            self.blocks.move_to_end(h)
        while len(self.blocks) > self.capacity:
            self.blocks.popitem(last=False)

    def clear(self) -> None:
        self.blocks.clear()


class EngineRouter:
    def __init__(self, schedulers: list[Scheduler]):
        self.schedulers = schedulers
        self.records = [PrefixRecord() for _ in schedulers]
        self.routed = {"prefix": 0, "load": 0}  # how requests were placed (status)

    # ------------------------------------------------------------ placing requests

    @staticmethod
    def load(s: Scheduler) -> int:
        return len(s.waiting) + len(s.running) + len(s.parked)

    def _usable(self) -> list[int]:
        """Engines that may take new work: the ready ones, else any not failed for good."""
        alive = [i for i, s in enumerate(self.schedulers) if not s.failed]
        return [i for i in alive if self.schedulers[i].ready] or alive

    def choose(self, chain: list[bytes]) -> int:
        """The engine for a prompt with this block_chain."""
        usable = self._usable()
        if not usable:
            return 0  # every engine failed: its scheduler answers the request so
        least = min(self.load(self.schedulers[i]) for i in usable)
        matched = {i: self.records[i].matched(chain) for i in usable}
        best = max(matched.values())
        if best > 0:
            near = [i for i in usable if matched[i] == best
                    and self.load(self.schedulers[i]) <= 2 * least + BALANCE_SLACK]
            if near:
                self.routed["prefix"] += 1
                return min(near, key=lambda i: (self.load(self.schedulers[i]), i))
        self.routed["load"] += 1
        return min(usable, key=lambda i: (self.load(self.schedulers[i]), -self.schedulers[i].free_blocks, i))

    def submit(self, req: Request) -> None:
        chain = block_chain(req.prompt) if len(self.schedulers) > 1 else []  # one engine: nothing to choose by
        self._place(req, self.choose(chain), chain)

    def _place(self, req: Request, i: int, chain: list[bytes]) -> None:
        req.engine = i
        self.records[i].add(chain)
        self.schedulers[i].submit(req)

    def abandon(self, req: Request) -> None:
        self.schedulers[req.engine].abandon(req)

    # ------------------------------------------------------------ engine deaths

    def on_engine_exit(self, i: int, reason: str, blame: bool = True) -> None:
        self.schedulers[i].on_engine_exit(reason, blame)
        self.records[i].clear()
        self._move_waiters(i)

    def on_engine_failed(self, i: int) -> None:
        self._move_waiters(i)
        self.schedulers[i].on_engine_failed()  # those left (no engine to go to) are answered

    def _move_waiters(self, i: int) -> None:
        """Engine i's waiters to live engines, each to the least loaded; they keep their arrival
        (and so their place: a queue serves the earliest arrival of a class first)."""
        source = self.schedulers[i]
        targets = [j for j in range(len(self.schedulers)) if j != i and self.schedulers[j].ready]
        if not targets:
            return
        for req in sorted(source.waiting, key=lambda r: r.arrived):
            source.hand_over(req)
            self._place(req, min(targets, key=lambda j: (self.load(self.schedulers[j]), j)), block_chain(req.prompt))

    # ------------------------------------------------------------ what the HTTP side reads

    @property
    def waiting(self) -> list[Request]:
        return [r for s in self.schedulers for r in s.waiting]

    @property
    def running(self) -> list[Request]:
        return [r for s in self.schedulers for r in s.running]

    @property
    def parked(self) -> list[Request]:
        return [r for s in self.schedulers for r in s.parked]

    @property
    def max_running(self) -> int:
        return sum(s.max_running for s in self.schedulers)

    @property
    def preempt(self) -> bool:
        return any(s.preempt for s in self.schedulers)

    @property
    def memory_full(self) -> bool:
        return any(s.memory_full for s in self.schedulers)

    def kv_status(self) -> dict:
        """The pools together: every count summed; block size and bytes as the first engine's."""
        parts = [s.kv_status() for s in self.schedulers]
        out = dict(parts[0])
        for part in parts[1:]:
            for key, value in part.items():
                if isinstance(value, int) and key not in ("kv_block", "kv_block_bytes", "bytes_per_token"):
                    out[key] = out.get(key, 0) + value
        reuse = {key: sum(s.reuse[key] for s in self.schedulers) for key in REUSE_KEYS}
        return out | experts_together([s.report.pool for s in self.schedulers]) | {"prefix_cache": reuse_summary(reuse)}

    def status(self) -> dict:
        """The first engine's status shape over all engines (lists joined, counts summed), and each
        engine's own under "engines"."""
        parts = [s.status() for s in self.schedulers]
        out = dict(parts[0])
        for part in parts[1:]:
            out["busy"] = out["busy"] or part["busy"]
            for key in ("queued", "parked_requests"):
                out[key] += part[key]
            for key in ("running", "parked", "waiting"):
                out[key] = out[key] + part[key]
            if out["prompt_progress"] is None:
                out["phase"], out["prompt_progress"] = part["phase"], part["prompt_progress"]
        return out | {"max_running": self.max_running, "kv": self.kv_status(), "preempt": self.preempt,
                      "waiting_for_memory": self.memory_full, "routed": dict(self.routed),
                      "engines": [p | {"engine": s.engine.state.value if s.engine else None}
                                  for p, s in zip(parts, self.schedulers)]}

    def shutdown(self) -> None:
        for s in self.schedulers:
            s.shutdown()

    def stop_running(self) -> None:
        for s in self.schedulers:
            s.stop_running()
