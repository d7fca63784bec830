"""A mixture-of-experts layer's routed experts in host memory behind a cache of expert slots on the GPU (issue 46:
models larger than the GPU). The kernels (engine/kernels/moe.cu) read each expert where its table says: a slot, or
the expert's page-locked host rows, which the GPU reads over the link. An expert computes the same bits from either
place as from resident weights: the same blocks, the same kernels.

A decode step routes on the device and reads through the tables, so nothing comes to the host during it and its
graph is captured like any other; the step writes its routes into a buffer at a fixed address (`routes`). After the
step (refill) the host reads them, scores every expert by its recent use (a use adds 1, each step multiplies the
scores by DECAY), and brings the best-scoring experts read from host memory into the slots of the worst-scoring
ones, a few a step, then rewrites the tables. A prompt chunk's experts go in runs of consecutive rows whose experts
fit the slots, every one of them copied in first (a chunk's many rows read each expert's rows many times: once
over the link, then from the slot), its rows renamed to slot numbers; the tables are rewritten before the next
layer's step (a decode step between a read's layers reads through them).

On a GPU the host's copy of the experts is page-locked (engine/ops/backend.py Backend.pinned): copies run at the
link's rate and the kernels read it at its own address. The copies go on the current stream. On the CPU (NumPy the
"device") the cache changes nothing but what it counts: its checks and its reports run there too
(engine/ops/backend.py ArrayOps.mixture)."""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from engine.core.experts import Experts, ExpertStack
from engine.kernels.limits import COUNTER_SEQUENCES
from engine.kernels.moe_launch import expert_addresses

DECAY = 0.9  # each step's factor on the experts' use scores: a use ten steps ago counts about a third of one now


@dataclass
class CacheCounts:
    hits: int = 0  # experts a step wanted that were in a slot (once a step each)
    misses: int = 0  # experts a step wanted from host memory (read over the link, or copied in for a prompt chunk)
    bytes_copied: int = 0  # into slots
    tokens: int = 0  # rows routed through the layer

    def add(self, other: "CacheCounts") -> "CacheCounts":
        return CacheCounts(self.hits + other.hits, self.misses + other.misses,
                           self.bytes_copied + other.bytes_copied, self.tokens + other.tokens)


class ExpertCache:
    def __init__(self, xp, host: Experts, slots: int, used: int, swaps: int | None = None):
        """host: the layer's stacks in host memory (NumPy arrays of their blocks or values); slots: how many
        experts the device holds (at least `used`, the experts a token uses); swaps: the most experts a decode
        step's refill brings in (default: a tenth of the slots, at least one)."""
        self.xp, self.host, self.slots = xp, host, slots
        self.swaps = swaps or max(1, slots // 10)
        self.device = Experts(*(ExpertStack(s.kind, xp.empty((slots * s.rows, *s.data.shape[1:]), dtype=s.data.dtype),
                                            slots, s.rows, s.cols) for s in (host.gate, host.up, host.down)))
        count = host.gate.experts
        self.slot_of = np.full(count, -1, dtype=np.int64)  # expert -> its slot, -1 if none
        self.expert_in = np.full(slots, -1, dtype=np.int64)  # slot -> its expert, -1 if empty
        self.last_use = np.zeros(slots, dtype=np.int64)  # slot -> the step that last wanted it
        self.score = np.zeros(count)  # expert -> its recent use (refill)
        self.stale = True  # a placement changed since the decode tables were written (write_tables)
        self.step = 0
        self.counts = CacheCounts()
        self.slots_for(np.arange(min(slots, count)))  # the first experts, so that every slot holds one
        self.counts = CacheCounts()
        # on a GPU, the decode steps' view: each expert's rows where they are now (a slot's, else the host's), and
        # a step's routes at a fixed address, for refill (None on the CPU: nothing to read there)
        self.mapped = self.routes = None
        if xp is not np:
            self.mapped = Experts(*(replace(s, table=xp.zeros(count, dtype=xp.uint64))
                                    for s in (host.gate, host.up, host.down)))
            self.routes = xp.zeros((COUNTER_SEQUENCES, used), dtype=xp.int32)  # (rows, used): a decode step's
            # each stack's table with its experts' host addresses and its slots' device addresses (fixed)
            self.tables = [(m.table, expert_addresses(h), expert_addresses(d)) for m, h, d in zip(
                (self.mapped.gate, self.mapped.up, self.mapped.down), (host.gate, host.up, host.down),
                (self.device.gate, self.device.up, self.device.down))]
            self.write_tables()

    @property
    def gate(self) -> ExpertStack:  # the slots' stacks, as a resident layer's (its first experts at the start)
        return self.device.gate

    @property
    def up(self) -> ExpertStack:
        return self.device.up

    @property
    def down(self) -> ExpertStack:
        return self.device.down

    def slots_for(self, chosen: np.ndarray) -> np.ndarray:
        """chosen (n, k) expert numbers -> the same as slot numbers, every expert in them copied in first."""
        wanted = np.unique(chosen)
        if len(wanted) > self.slots:
            raise ValueError(f"a step wants {len(wanted)} experts; the cache holds {self.slots}")
        self.step += 1
        cached = wanted[self.slot_of[wanted] >= 0]
        self.last_use[self.slot_of[cached]] = self.step
        self.counts.hits += len(cached)
        for e in wanted[self.slot_of[wanted] < 0]:
            free = np.flatnonzero(self.last_use < self.step)  # slots this step does not want
            self.place(int(e), int(free[np.argmin(self.last_use[free])]))
            self.counts.misses += 1
        return self.slot_of[chosen]

    def place(self, e: int, slot: int) -> None:
        """Expert e copied into the slot (its expert before, if any, back to host memory only); the tables are
        stale until write_tables."""
        if self.expert_in[slot] >= 0:
            self.slot_of[self.expert_in[slot]] = -1
        self.copy_in(e, slot)
        self.slot_of[e], self.expert_in[slot], self.last_use[slot] = slot, e, self.step
        self.stale = True

    def copy_in(self, e: int, slot: int) -> None:
        """Expert e's gate, up and down rows into the slot: on a GPU an asynchronous copy on the current stream, from
        page-locked memory (Backend.pinned), which the step's kernels after it wait for."""
        for src, dst in zip((self.host.gate, self.host.up, self.host.down),
                            (self.device.gate, self.device.up, self.device.down)):
            rows, into = src.data[e * src.rows : (e + 1) * src.rows], dst.data[slot * dst.rows : (slot + 1) * dst.rows]
            if self.xp is np:
                into[...] = rows
            else:
                into.set(rows)
            self.counts.bytes_copied += rows.nbytes

    def write_tables(self) -> None:
        """The decode tables from where each expert is now, if a placement changed since they were written (on the
        current stream: after the copies before it)."""
        if not self.stale:
            return
        cached = self.slot_of >= 0
        for table, host_at, slot_at in self.tables:
            at = host_at.copy()
            at[cached] = slot_at[self.slot_of[cached]]
            table.set(at)
        self.stale = False

    def placed(self, picks: np.ndarray):
        """picks (n, k) expert numbers on the host -> (rows, slots) for each run of consecutive rows whose experts
        fit the cache, in order: `rows` a slice of the n, `slots` picks[rows] as slot numbers, every expert in them
        copied in (before the next run's copies may evict it)."""
        self.counts.tokens += len(picks)
        for rows in self.runs(picks):
            yield rows, self.slots_for(picks[rows])

    def mixture(self, moe, h, values, router, k: int, normalize: bool, decode: bool):
        """The layer's output (n, dim) fp16 for rows h (a decode step's Row8, or a prompt chunk's values: `values`
        the rows as fp16) -> (out, chosen, weights), chosen in expert numbers. A decode step through the tables (its
        routes kept for refill), a prompt chunk from the slots."""
        chosen, weights = moe.route(values, router, k, normalize, decode=decode)
        if decode:
            self.routes[: len(chosen)] = chosen
            return moe.decode(h, self.mapped, chosen, weights), chosen, weights
        picks = np.asarray(chosen.get())  # (n, k) on the host: which experts to have in slots
        out = self.xp.empty((len(picks), self.host.down.rows), dtype=self.xp.float16)
        for rows, slots in self.placed(picks):
            out[rows] = moe.prompt(values[rows], self.device, self.on_device(slots), weights[rows])
        self.write_tables()
        return out, chosen, weights

    def refill(self, rows: int) -> None:
        """After a decode step of `rows` rows (on a GPU): its routes counted, the scores moved on, and up to `swaps`
        of the experts it read from host memory brought into the slots of lower-scoring ones, the tables rewritten."""
        if self.routes is None:
            return
        picks = np.asarray(self.routes[:rows].get())  # (rows, k): the step is done (the engine reads its logits)
        wanted = np.unique(picks)
        cached = self.slot_of[wanted] >= 0
        self.counts.tokens += rows
        self.counts.hits += int(cached.sum())
        self.counts.misses += len(wanted) - int(cached.sum())
        self.score *= DECAY
        np.add.at(self.score, picks.reshape(-1), 1.0)
        self.step += 1
        self.last_use[self.slot_of[wanted[cached]]] = self.step
        outside = wanted[~cached]
        for e in outside[np.argsort(-self.score[outside], kind="stable")][: self.swaps]:
            held = np.flatnonzero(self.last_use < self.step)  # slots this step did not read
            if not len(held):
                break
            # the slots' experts' scores, an empty slot's lowest (filled first)
            kept = np.where(self.expert_in[held] >= 0, self.score[self.expert_in[held]], -np.inf)
            slot = int(held[np.argmin(kept)])
            if kept.min() >= self.score[e]:
                break
            self.place(int(e), slot)
        self.write_tables()

    def runs(self, picks: np.ndarray) -> list[slice]:
        """A step's rows in runs of consecutive rows, in order, each wanting at most `slots` experts."""
        out, start, wanted = [], 0, set()
        for r, experts in enumerate(picks):
            if len(wanted | set(experts.tolist())) > self.slots:
                out.append(slice(start, r))
                start, wanted = r, set()
            wanted |= set(experts.tolist())
        return [*out, slice(start, len(picks))]

    def on_device(self, slots: np.ndarray):
        return self.xp.asarray(slots.astype(np.int32))


def caches(layers) -> list[ExpertCache]:
    """The layers' expert caches (none where every expert is resident)."""
    return [layer.experts for layer in layers if isinstance(getattr(layer, "experts", None), ExpertCache)]


def cache_report(held: list[ExpertCache]) -> dict[str, int]:
    """The caches' counts for the engine's pool report (empty without a cache): slots in all, experts a step
    found in a slot and copied in, bytes copied, and the tokens routed (rows through the first cached layer)."""
    if not held:
        return {}
    counts = CacheCounts()
    for cache in held:
        counts = counts.add(cache.counts)
    return {"expert_slots": sum(c.slots for c in held), "expert_layers": len(held), "expert_hits": counts.hits,
            "expert_misses": counts.misses, "expert_bytes": counts.bytes_copied, "expert_tokens": held[0].counts.tokens}
