"""A hybrid model's recurrent state (Qwen3-Next, Qwen3.5: engine/model/hybrid.py): per request and
linear-attention layer, the convolution's window and the delta rule's matrix, float32 as the
references keep them.

Exactness: a prompt's positions go through the delta rule in chunks at absolute multiples of
CHUNK (engine/ops/delta_rule.py), so a read must start at such a boundary, from the state there.
SequenceState keeps two states: `now`, after the last position through the model (read or decoded:
what the next decode row continues), and `mark`, at the last chunk boundary a read reached (what
the next read continues from; reading again the rows from the mark to where `now` is gives the same
bits). A park keeps both (they are the request's, like its KV rows)."""
from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass

import numpy as np

from engine.modelfile.model_config import ModelConfig, ModelLoadError
from engine.ops.delta_rule import CHUNK


_allocating = nullcontext  # where a device state's arrays come from: a GPU engine's states' own pool once set


def allocate_states_in(allocating) -> None:
    """Every state made on a device from now on is made inside `allocating()` (engine/kvcache/state_memory.py:
    one engine process, one GPU and its states' pool)."""
    global _allocating
    _allocating = allocating


@dataclass
class RecurrentState:
    conv: np.ndarray  # (linear layers, kernel-1, channels) float32: the convolution's last inputs
    ssm: np.ndarray  # (linear layers, heads, dk, dv) float32: the delta rule's matrices

    @classmethod
    def zeros(cls, layers: int, kernel: int, channels: int, heads: int, dk: int, dv: int, xp=np) -> RecurrentState:
        with _allocating():
            return cls(xp.zeros((layers, kernel - 1, channels), np.float32),
                       xp.zeros((layers, heads, dk, dv), np.float32))

    def copy(self, xp=None) -> RecurrentState:
        """A copy where this one is, or on xp's device (numpy: the host; a GPU's prefix states and parked
        requests' states are kept in host memory)."""
        if xp is np:
            return RecurrentState(host_copy(self.conv), host_copy(self.ssm))
        with _allocating():
            if xp is None:
                return RecurrentState(self.conv.copy(), self.ssm.copy())
            return RecurrentState(xp.array(self.conv), xp.array(self.ssm))

    @property
    def nbytes(self) -> int:
        return int(self.conv.nbytes + self.ssm.nbytes)

    def digest(self) -> bytes:
        """Its bytes (a request's fingerprint), from wherever they are."""
        return host_copy(self.conv).tobytes() + host_copy(self.ssm).tobytes()

    def equals(self, other: RecurrentState) -> bool:
        return bool((self.conv == other.conv).all() and (self.ssm == other.ssm).all())


def host_copy(a) -> np.ndarray:
    """A host copy of an array on the host or a GPU."""
    return a.copy() if isinstance(a, np.ndarray) else a.get()


def state_bytes(cfg: ModelConfig) -> int:
    """One recurrent state's bytes (a hybrid's; 0 for other models): a running request holds two."""
    h = cfg.hybrid
    if h is None:
        return 0
    return 4 * len(h.linear_layers) * ((h.conv_kernel - 1) * h.channels + h.v_heads * h.dk * h.dv)


def zero_state(cfg: ModelConfig, xp, chunk: int) -> RecurrentState | None:
    """A hybrid model's recurrent state at position 0 on xp's device; None for other models. Refuses a chunk
    that is not a whole number of the delta rule's chunks."""
    h = cfg.hybrid
    if h is None:
        return None
    if chunk % CHUNK:
        raise ModelLoadError(f"{cfg.arch}: --chunk must be a multiple of {CHUNK} (the delta rule's chunks)")
    return RecurrentState.zeros(len(h.linear_layers), h.conv_kernel, h.channels, h.v_heads, h.dk, h.dv, xp)


@dataclass
class SequenceState:
    now: RecurrentState  # after position `now_at` - 1
    mark: RecurrentState  # after position `mark_at` - 1, a multiple of CHUNK: where a read starts
    now_at: int = 0
    mark_at: int = 0

    @classmethod
    def fresh(cls, zeros: RecurrentState) -> SequenceState:
        return cls(zeros.copy(), zeros.copy())

    @classmethod
    def at(cls, state: RecurrentState, pos: int, xp=None) -> SequenceState:
        """A read that starts at `pos` (a chunk boundary) from a kept `state` (copied, onto xp's device if
        given): a cached prefix."""
        assert pos % CHUNK == 0, pos
        return cls(state.copy(xp), state.copy(xp), pos, pos)

    def on(self, xp) -> SequenceState:
        """This state on xp's device (a GPU request's parked in host memory, and back): itself if it is there."""
        if isinstance(self.now.ssm, np.ndarray) == (xp is np):
            return self
        return SequenceState(self.now.copy(xp), self.mark.copy(xp), self.now_at, self.mark_at)

    def rewind(self) -> int:
        """Before a read: `now` back to the mark (the rows after it are read again, to the same bits).
        Returns the position the read starts at."""
        if self.now_at != self.mark_at:
            self.now, self.now_at = self.mark.copy(), self.mark_at
        return self.mark_at

    def next_mark(self, start: int, n: int) -> int:
        """A read of n positions from `start` (the mark): the last chunk boundary it reaches, where the
        forward copies each layer's state into `mark` (start itself if it reaches none)."""
        assert start == self.mark_at == self.now_at and start % CHUNK == 0, (start, self.mark_at, self.now_at)
        return start + n // CHUNK * CHUNK

    def read(self, start: int, n: int) -> None:
        """The forward read n positions from `start`: `now` is after them, `mark` at next_mark's boundary."""
        self.now_at, self.mark_at = start + n, self.next_mark(start, n)

    def decoded(self) -> None:
        """A decode row went through the model: `now` is one position further (the mark stays)."""
        self.now_at += 1
