"""A mixture-of-experts layer's routed experts in host memory behind a cache of expert slots on the GPU (issue 46:
models larger than the GPU). The router runs on the device; its choices come to the host, the experts chosen
and not cached are copied into slots (the least recently used slot not wanted by this step goes first), and the
expert kernels (engine/kernels/moe.cu) run on the slots with the choices renamed to slot numbers. An expert
computes the same bits from a slot as from resident weights: the same blocks, the same kernels. On a GPU the host's
copy of the experts is page-locked (engine/ops/backend.py Backend.pinned): a copy runs at the link's rate, where
one from the file's pages went through the driver's staging at a fraction of it.

A step's rows may want more experts than the cache holds (a prompt chunk's, or a decode step of many requests): they
go in runs of consecutive rows whose experts fit (each row's output is the kernels' for that row alone, so the runs
change no bit). The copies go on the current stream.
On the CPU (NumPy the "device") the cache changes nothing but what it counts: its checks and its reports run
there too (engine/ops/backend.py ArrayOps.mixture)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from engine.core.experts import Experts, ExpertStack


@dataclass
class CacheCounts:
    hits: int = 0  # experts a step wanted that were in a slot (once a step each)
    misses: int = 0  # experts copied in
    bytes_copied: int = 0
    tokens: int = 0  # rows routed through the layer

    def add(self, other: "CacheCounts") -> "CacheCounts":
        return CacheCounts(self.hits + other.hits, self.misses + other.misses,
                           self.bytes_copied + other.bytes_copied, self.tokens + other.tokens)


class ExpertCache:
    def __init__(self, xp, host: Experts, slots: int):
        """host: the layer's stacks in host memory (NumPy arrays of their blocks or values); slots: how many
        experts the device holds (at least the experts a token uses)."""
        self.xp, self.host, self.slots = xp, host, slots
        self.device = Experts(*(ExpertStack(s.kind, xp.empty((slots * s.rows, *s.data.shape[1:]), dtype=s.data.dtype),
                                            slots, s.rows, s.cols) for s in (host.gate, host.up, host.down)))
        self.slot_of = np.full(host.gate.experts, -1, dtype=np.int64)  # expert -> its slot, -1 if none
        self.expert_in = np.full(slots, -1, dtype=np.int64)  # slot -> its expert, -1 if empty
        self.last_use = np.zeros(slots, dtype=np.int64)  # slot -> the step that last wanted it
        self.step = 0
        self.counts = CacheCounts()
        self.slots_for(np.arange(min(slots, host.gate.experts)))  # the first experts, so that every slot holds one
        self.counts = CacheCounts()

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
            slot = int(free[np.argmin(self.last_use[free])])
            if self.expert_in[slot] >= 0:
                self.slot_of[self.expert_in[slot]] = -1
            self.copy_in(int(e), slot)
            self.slot_of[e], self.expert_in[slot], self.last_use[slot] = slot, e, self.step
        return self.slot_of[chosen]

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
        self.counts.misses += 1

    def placed(self, picks: np.ndarray):
        """picks (n, k) expert numbers on the host -> (rows, slots) for each run of consecutive rows whose experts
        fit the cache, in order: `rows` a slice of the n, `slots` picks[rows] as slot numbers, every expert in them
        copied in (before the next run's copies may evict it)."""
        self.counts.tokens += len(picks)
        for rows in self.runs(picks):
            yield rows, self.slots_for(picks[rows])

    def mixture(self, moe, h, values, router, k: int, normalize: bool, decode: bool):
        """The layer's output (n, dim) fp16 for rows h (a decode step's Row8, or a prompt chunk's values: `values`
        the rows as fp16) from the cached experts -> (out, chosen, weights), chosen in expert numbers."""
        chosen, weights = moe.route(values, router, k, normalize, decode=decode)
        picks = np.asarray(chosen.get())  # (n, k) on the host: which experts to have in slots
        out = self.xp.empty((len(picks), self.host.down.rows), dtype=self.xp.float16)
        for rows, slots in self.placed(picks):
            if decode:
                out[rows] = moe.decode(h.rows(rows), self.device, self.on_device(slots), weights[rows])
            else:
                out[rows] = moe.prompt(values[rows], self.device, self.on_device(slots), weights[rows])
        return out, chosen, weights

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
