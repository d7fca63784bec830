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

    def __init__(self, params: SamplingParams, prompt: tuple[int, ...], drawn: int = 0, constraint=None):
        """drawn: tokens already sampled by this request (a continuation after an engine restart);
        their draws are skipped so that a seeded stream continues where it was. constraint: the
        request's grammar (engine/runner/grammar_mask.py), already past those tokens."""
        self.params, self.constraint = params, constraint
        seed = params.seed if params.seed is not None else int.from_bytes(os.urandom(8), "little")
        self.rng = np.random.Generator(np.random.PCG64(seed % 2**64))
        self.recent = list(prompt[-params.repeat_last_n :]) if params.repeat_last_n else []
        if params.temperature > 0 and drawn:
            self.rng.random(drawn)  # one uniform draw per sampled token (see sample)

    def sample(self, logits, xp=np, draws=None) -> int:
        """logits: (vocab,) float32 on the host (xp = numpy), or on the GPU (xp = cupy): there a
        temperature draw runs where the logits are (pick_sorted) and only the token comes back;
        `draws` (engine/runner/sampling_graph.py) replays the penalties and the pick as a CUDA graph when the
        logits are a decode graph's own buffer. The RNG stays on the host either way: one uniform
        per sampled token, fingerprinted with the parked state."""
        p = self.params
        if draws is not None:  # the penalties, the grammar's mask, the argmax or the draw: one graph replay
            mask = self.constraint.mask_words() if self.constraint is not None else None
            u = self.rng.random() if p.temperature > 0 else None
            return draws.draw(logits, u, p, self.penalty_counts() if self.penalized else None, mask)
        # one argmax: the copy and a host argmax cost less than a device reduction and its
        # synchronization; a grammar's mask goes to the device instead (4 KiB, not the logits)
        if xp is not np and p.temperature == 0 and self.constraint is None:
            logits, xp = xp.asnumpy(logits), np
        logits = self.apply_penalties(logits, xp)
        if self.constraint is not None:
            logits = self.constraint.restrict(logits, xp)
        if p.temperature == 0:
            return int(xp.argmax(logits))
        u = self.rng.random()  # exactly one uniform draw per sampled token: a restart can skip them
        scaled = scale(logits, p)
        return pick(scaled, u, p) if xp is np else pick_sorted(xp, scaled, u, p)

    def logprobs(self, logits, token: int, top: int) -> tuple[float, tuple[tuple[int, float], ...]]:
        """The log-probability of `token` and of the `top` likeliest tokens (ties by index), under the
        logits the draw read: after the penalties and the grammar's mask, before the temperature and
        the top-k / top-p / min-p cuts. Tokens the grammar forbids are never among the top."""
        if not isinstance(logits, np.ndarray):  # on the GPU: one copy for a request that asked
            logits = logits.get()
        logits = self.apply_penalties(logits)
        if self.constraint is not None:
            logits = self.constraint.restrict(logits)
        x = logits.astype(np.float64)  # (vocab,)
        peak = x.max()
        logz = peak + np.log(np.exp(x - peak).sum())
        return float(x[token] - logz), top_scores(logits, top, float(logz))

    @property
    def penalized(self) -> bool:
        """Whether a penalty changes the logits of the next draw."""
        p = self.params
        return bool(self.recent) and (p.repeat_penalty != 1 or bool(p.presence_penalty) or bool(p.frequency_penalty))

    @property
    def batchable(self) -> bool:
        """Every draw of this request a plain temperature draw (no penalty, no grammar): on the GPU drawn
        with the other such rows of its step (engine/runner/batch_draws.py)."""
        p = self.params
        return (p.temperature > 0 and self.constraint is None and p.repeat_penalty == 1 and not p.presence_penalty
                and not p.frequency_penalty)

    def uniform(self) -> float:
        """The next sampled token's uniform: exactly one a sampled token (see sample)."""
        return float(self.rng.random())

    @property
    def plain(self) -> bool:
        """The next draw reads the logits as they are (no penalty, no grammar's mask)."""
        return not self.penalized and self.constraint is None

    @property
    def plain_greedy(self) -> bool:
        """The next token is the argmax of the logits as they are (a decode graph computes it)."""
        return self.params.temperature == 0 and self.plain

    def apply_penalties(self, logits, xp=np):
        """A penalized copy of `logits`, or `logits` itself when no penalty applies."""
        p = self.params
        if not self.penalized:
            return logits
        logits = logits.astype(np.float32, copy=True)
        ids, freq = self.penalty_counts()
        penalize(xp, logits, xp.asarray(ids), xp.asarray(freq), p)
        return logits

    def penalty_counts(self) -> tuple[np.ndarray, np.ndarray]:
        """The distinct recent tokens (int64) and how often each occurs (float32)."""
        counts = Counter(self.recent)
        return np.fromiter(counts.keys(), dtype=np.int64), np.fromiter(counts.values(), dtype=np.float32)

    def accept(self, token: int) -> None:
        if self.constraint is not None:
            self.constraint.accept(token)
        if self.params.repeat_last_n:
            self.recent = (self.recent + [token])[-self.params.repeat_last_n :]

    def state_digest(self) -> bytes:
        h = hashlib.blake2b(digest_size=16)
        h.update(repr(self.rng.bit_generator.state).encode())
        h.update(np.asarray(self.recent, dtype=np.int64).tobytes())
        return h.digest()


def allowed_tokens(xp, words, vocab: int):
    """(vocab,) bool: bit t % 32 of words[t // 32], a grammar's mask (engine/runner/grammar_mask.py mask_words),
    on the device or the host."""
    t = xp.arange(vocab, dtype=np.uint32)
    return ((words[t >> np.uint32(5)] >> (t & np.uint32(31))) & np.uint32(1)).astype(bool)


def scale(logits, p: SamplingParams):
    """Logits over the temperature (a new float32 array), as every draw takes them."""
    return logits.astype(np.float32, copy=False) / np.float32(p.temperature)


def penalize(xp, logits, ids, freq, p: SamplingParams) -> None:
    """In place: the repeat penalty (divide a positive logit, multiply a negative one), then the
    frequency (times the count) and presence penalties, on the logits of tokens `ids`."""
    seen = logits[ids]
    seen = xp.where(seen > 0, seen / np.float32(p.repeat_penalty), seen * np.float32(p.repeat_penalty))
    logits[ids] = seen - freq * np.float32(p.frequency_penalty) - np.float32(p.presence_penalty)


def descending_order(x, xp=np):
    """The permutation np.argsort(-x, kind="stable") gives (ties keep index order), 5x faster:
    one unstable sort of unique uint64 keys (value order in the high half, index in the low).
    On the GPU (xp = cupy) the sort is a radix sort of the same keys."""
    bits = (-x.astype(np.float32) + np.float32(0)).view(np.uint32)  # + 0 folds -0.0 into 0.0
    ordered = xp.where(bits >> 31, ~bits, bits | np.uint32(0x80000000)).astype(np.uint64)
    keys = (ordered << np.uint64(32)) | xp.arange(len(x), dtype=np.uint64)
    return (xp.sort(keys) & np.uint64(0xFFFFFFFF)).astype(np.intp)


# ---------------------------------------------------------------- the draw

PREFIXES = (256, 4096)  # best candidates sorted before the whole vocabulary is (almost never)


def pick(scaled: np.ndarray, u: float, p: SamplingParams) -> int:
    """The token at uniform draw u from logits / temperature: candidates in descending order (ties
    by index), cut by top-k, top-p and min-p, then the inverse CDF. Decided on the shortest sorted
    prefix of the candidates that settles it, which is exactly what sorting all of them gives (the
    weights, the normalizer and the cumulative sums are the same numbers), at a fraction of the
    cost: a temperature draw over 49K logits took 1.9 ms with a full sort."""
    if p.top_k:  # the candidates are the first k: sort exactly them, weigh only them
        order = canonical_prefix(scaled, min(p.top_k, len(scaled)))[: p.top_k]
        e = np.exp(scaled[order] - scaled[order[0]])  # the best candidate weighs 1
        return choose(order, e, float(e.sum()), len(order), keep_by_min_p(e, p), u, p)
    weights = np.exp(scaled - scaled.max())  # (vocab,) the best candidate weighs 1
    total, keep_min = float(weights.sum()), keep_by_min_p(weights, p)
    for m in (*PREFIXES, len(scaled)):
        order = canonical_prefix(scaled, min(m, len(scaled)))
        token = choose(order, weights[order], total, len(scaled), keep_min, u, p)
        if token is not None:
            return token
    raise AssertionError("the whole vocabulary always decides")


def pick_sorted(xp, scaled, u: float, p: SamplingParams) -> int:
    """pick's draw with every candidate sorted, written over the array module: on the GPU a sort of
    the whole vocabulary costs tens of microseconds, and this runs as a few kernels with one
    transfer (the token) at the end, where pick on the host takes milliseconds for a flat
    distribution (it must then sort most of the vocabulary). On NumPy it gives pick's token: the
    same weights, normalizer and cumulative sums."""
    return int(draw_index(xp, scaled, u, p))


def draw_index(xp, scaled, u, p: SamplingParams):
    """pick_sorted's token as a 0-d array where the logits are, with no transfer and no host value
    read back: u may be a 0-d device array, so that the whole draw can be captured as a CUDA graph
    (engine/runner/sampling_graph.py) and replayed with a new u."""
    order = descending_order(scaled, xp)  # (vocab,) canonical order
    if p.top_k:
        order = order[: p.top_k]
        e = xp.exp(scaled[order] - scaled[order[0]])  # the best candidate weighs 1
        total = e.sum()
    else:
        weights = xp.exp(scaled - scaled.max())
        total, e = weights.sum(), weights[order]  # the normalizer summed in index order, as pick's
    n, total = len(order), total.astype(np.float64)
    keep = n
    if p.min_p > 0:
        keep = xp.maximum(1, xp.count_nonzero(e >= np.float32(p.min_p)))
    cum = xp.cumsum(e, dtype=np.float64)
    if p.top_p < 1.0:  # the smallest set reaching top_p
        keep = xp.minimum(keep, xp.searchsorted(cum, p.top_p * total) + 1)
    keep = xp.minimum(keep, n)
    mass = xp.where(keep == n, total, cum[keep - 1])  # no cut: the index-order sum
    at = xp.minimum(xp.searchsorted(cum, u * mass, side="right"), keep - 1)  # rounding at the very end
    return order[at]


def keep_by_min_p(weights: np.ndarray, p: SamplingParams) -> int:
    """How many candidates min-p keeps (weights are relative to the best, which weighs 1)."""
    return max(1, int(np.count_nonzero(weights >= p.min_p))) if p.min_p > 0 else len(weights)


def choose(order: np.ndarray, e: np.ndarray, total: float, n: int, keep_min: int, u: float,
           p: SamplingParams) -> int | None:
    """order: the first len(order) of the n candidates in canonical order, e their weights, total
    the weight of all n. The chosen token, or None when this prefix cannot decide."""
    m = len(order)
    cum = np.cumsum(e, dtype=np.float64)
    keep = min(n, keep_min)
    if p.top_p < 1.0:
        j = int(np.searchsorted(cum, p.top_p * total))  # the smallest set reaching top_p
        if j >= m and m < n:
            return None
        keep = min(keep, j + 1, m)
    if keep == n:  # no cut: every candidate, and their weight summed in index order
        mass = total
    elif keep <= m:
        mass = cum[keep - 1]
    else:  # a cut lies beyond this prefix
        return None
    seen = min(keep, m)
    at = int(np.searchsorted(cum[:seen], u * mass, side="right"))
    if at < seen:
        return int(order[at])
    return int(order[keep - 1]) if keep <= m else None  # rounding at the very end, or undecided


def canonical_prefix(x: np.ndarray, m: int) -> np.ndarray:
    """The first (at least) m indices of descending_order(x), without sorting the rest: every value
    at or above the m-th largest, then sorted. Ties at the edge are all taken, so it is exact."""
    if m >= len(x):
        return descending_order(x)
    edge = np.partition(x, len(x) - m)[len(x) - m]
    idx = np.flatnonzero(x >= edge)
    return idx[descending_order(x[idx])]


def top_scores(logits: np.ndarray, top: int, logz: float) -> tuple[tuple[int, float], ...]:
    """The `top` likeliest tokens of logits (vocab,) on the host (ties by index) and their log-probabilities
    under the log-partition logz; tokens the logits rule out (-inf: a grammar's mask) are never among them."""
    order = canonical_prefix(logits, top)[:top] if top else ()
    return tuple((int(t), float(np.float64(logits[t]) - logz)) for t in order if np.isfinite(logits[t]))
