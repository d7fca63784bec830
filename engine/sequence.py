"""One request's state inside the engine, from GEN to DONE, across parks."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from engine.sampler import Sampler


@dataclass
class Sequence:
    id: int | None
    prompt: tuple[int, ...]
    max_new: int
    sampler: Sampler
    stop_ids: frozenset[int]
    fingerprints: bool = False
    drawn: int = 0  # tokens generated before an engine restart; the prompt ends with them
    pos: int = 0  # prompt tokens read so far (KV rows filled)
    generated: list[int] = field(default_factory=list)
    logits: np.ndarray | None = None  # (vocab,) of the last position read, until sampled
    parks: int = 0
    park_ms: float = 0.0  # time spent copying snapshots out and back in
    prompt_ms: float = 0.0
    decode_ms: float = 0.0
    finish: str | None = None

    @property
    def total(self) -> int:
        return len(self.prompt)

    @property
    def reading(self) -> bool:
        return self.pos < self.total

    @property
    def kv_len(self) -> int:
        """Positions whose K/V rows are in the cache (the prompt plus all but the newest token)."""
        return self.pos + max(0, len(self.generated) - 1)
