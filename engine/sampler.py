"""Sampling from logits: penalties, greedy or temperature with top-k / top-p / min-p, per-request RNG."""
from __future__ import annotations

import hashlib
import os
from collections import Counter
from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    min_p: float = 0.0
    seed: int | None = None
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    stop: tuple[int, ...] = field(default=())

    def __post_init__(self):
        checks = {
            "temperature": self.temperature >= 0, "top_p": 0 < self.top_p <= 1, "top_k": self.top_k >= 0,
            "min_p": 0 <= self.min_p <= 1, "repeat_penalty": self.repeat_penalty > 0,
            "repeat_last_n": self.repeat_last_n >= 0,
            "presence_penalty": -2 <= self.presence_penalty <= 2,
            "frequency_penalty": -2 <= self.frequency_penalty <= 2,
        }
        bad = [k for k, ok in checks.items() if not ok]
        if bad:
            raise ValueError(f"invalid sampling value for {bad[0]}: {getattr(self, bad[0])}")


class Sampler:
    """Holds everything sampling reads: the RNG and the penalty window of recent tokens."""

    def __init__(self, params: SamplingParams, prompt: tuple[int, ...], drawn: int = 0):
        """drawn: tokens already sampled by this request (a continuation after an engine restart);
        their draws are skipped so that a seeded stream continues where it was."""
        self.params = params
        seed = params.seed if params.seed is not None else int.from_bytes(os.urandom(8), "little")
        self.rng = np.random.Generator(np.random.PCG64(seed % 2**64))
        self.recent = list(prompt[-params.repeat_last_n :]) if params.repeat_last_n else []
        if params.temperature > 0 and drawn:
            self.rng.random(drawn)  # one uniform draw per sampled token (see sample)

    def sample(self, logits: np.ndarray) -> int:
        """logits: (vocab,) float32 on the host."""
        p = self.params
        logits = self.apply_penalties(logits)
        if p.temperature == 0:
            return int(np.argmax(logits))
        order = descending_order(logits)  # candidates, best first
        if p.top_k:
            order = order[: p.top_k]
        probs = softmax(logits[order] / p.temperature)
        keep = len(probs)
        if p.top_p < 1.0:
            keep = min(keep, int(np.searchsorted(np.cumsum(probs), p.top_p)) + 1)
        if p.min_p > 0:
            keep = min(keep, max(1, int(np.sum(probs >= p.min_p * probs[0]))))
        cdf = np.cumsum(probs[:keep])  # exactly one uniform draw per token: a restart can skip them
        return int(order[min(int(np.searchsorted(cdf / cdf[-1], self.rng.random(), side="right")), keep - 1)])

    def apply_penalties(self, logits: np.ndarray) -> np.ndarray:
        """A penalized copy of `logits`, or `logits` itself when no penalty applies."""
        p = self.params
        if not self.recent or (p.repeat_penalty == 1 and not p.presence_penalty and not p.frequency_penalty):
            return logits
        logits = logits.astype(np.float32, copy=True)
        counts = Counter(self.recent)
        ids = np.fromiter(counts.keys(), dtype=np.int64)
        freq = np.fromiter(counts.values(), dtype=np.float32)
        seen = logits[ids]
        seen = np.where(seen > 0, seen / p.repeat_penalty, seen * p.repeat_penalty)
        logits[ids] = seen - freq * p.frequency_penalty - p.presence_penalty
        return logits

    def accept(self, token: int) -> None:
        if self.params.repeat_last_n:
            self.recent = (self.recent + [token])[-self.params.repeat_last_n :]

    def state_digest(self) -> bytes:
        h = hashlib.blake2b(digest_size=16)
        h.update(repr(self.rng.bit_generator.state).encode())
        h.update(np.asarray(self.recent, dtype=np.int64).tobytes())
        return h.digest()


def descending_order(x: np.ndarray) -> np.ndarray:
    """The permutation np.argsort(-x, kind="stable") gives (ties keep index order), 5x faster:
    one unstable sort of unique uint64 keys (value order in the high half, index in the low)."""
    bits = (-x.astype(np.float32) + np.float32(0)).view(np.uint32)  # + 0 folds -0.0 into 0.0
    ordered = np.where(bits >> 31, ~bits, bits | np.uint32(0x80000000)).astype(np.uint64)
    keys = (ordered << np.uint64(32)) | np.arange(len(x), dtype=np.uint64)
    return (np.sort(keys) & np.uint64(0xFFFFFFFF)).astype(np.intp)


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max())
    return e / e.sum()
