"""What one engine has reported of its KV pool: its latest pool line, its prefix-cache lookups and
its DEFERs, as /status, the metrics and the router read them."""
from __future__ import annotations

from protocol import messages as m

from serve.scheduling.metrics import EXPERT_KEYS, REUSE_KEYS


class PoolReport:
    def __init__(self):
        self.pool: dict[str, int] = {}  # the engine's latest pool report (INFO without an id)
        self.reuse = dict.fromkeys(REUSE_KEYS, 0)  # this engine's prefix-cache lookups (/status)
        self.deferred = 0  # DEFER lines seen
        self.expert_seen = dict.fromkeys(EXPERT_KEYS, 0)  # the expert cache's counts as last reported

    @property
    def free_blocks(self) -> int:
        return self.pool.get("free", 0)

    def on_pool(self, msg: m.Info) -> dict[str, int]:
        """The engine's pool report: blocks used / cached / free, paused requests, an expert cache's counts, ...
        -> what the expert cache's counts (EXPERT_KEYS) moved since the last report."""
        for key, value in msg.fields.items():
            if key.startswith("pool_"):
                try:
                    self.pool[key[5:]] = int(value)
                except ValueError:
                    pass
        moved = {key: self.pool[key] - self.expert_seen[key] for key in EXPERT_KEYS if key in self.pool}
        self.expert_seen |= {key: self.pool[key] for key in moved}
        return moved

    def count_reuse(self, cached: int, from_host: int) -> None:
        """One request's prefix-cache lookup (its INFO after GEN)."""
        self.reuse["lookups"] += 1
        if cached:
            self.reuse["hits"] += 1
            self.reuse["tokens_reused"] += cached
            self.reuse["tokens_from_host"] += from_host

    def engine_gone(self) -> None:
        """The engine died: its pool went with it (the counts of lookups stay; a new engine's cache counts from 0)."""
        self.pool = {}
        self.expert_seen = dict.fromkeys(EXPERT_KEYS, 0)
