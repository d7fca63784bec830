"""The gates a park must pass (the chunk boundaries it parks at: engine/core/chunks.py)."""
from __future__ import annotations

from dataclasses import dataclass

from engine.runner.sequence import Sequence


@dataclass(frozen=True)
class ParkPolicy:
    enabled: bool = False
    min_tokens: int = 256  # a read parks only once it has reached this position
    max_parks: int = 16  # parks per request
    budget_bytes: int = 2048 * 2**20  # one hard budget over all snapshots
    max_parked: int = 4  # parked reads at a time (in their slots or moved to host memory)

    def __post_init__(self):
        if self.min_tokens < 0 or self.max_parks < 0 or self.budget_bytes < 0 or self.max_parked < 0:
            raise ValueError("park limits must be >= 0")

    def decline_reason(self, seq: Sequence, snapshot_bytes: int, used_bytes: int, parked: int) -> str | None:
        """None if `seq` may park now; else the name of the first gate that refuses."""
        if not self.enabled:
            return "disabled"
        if seq.id is None:
            return "no_id"  # RESUME names a parked request by its id
        if not seq.reading or seq.generated:
            return "not_reading"
        if seq.pos < self.min_tokens:
            return "min_tokens"
        if seq.parks >= self.max_parks:
            return "max_parks"
        if parked >= self.max_parked:
            return "max_parked"
        if used_bytes + snapshot_bytes > self.budget_bytes:
            return "budget"
        return None
