"""Prompt weights kept expanded. On a GPU a prompt step's GEMMs read each quantized layer matrix expanded to fp16
(engine/ops/backend.py matmul: cuBLAS on the expansion); by default that expansion is written into a scratch buffer
at every step, ~13 GiB written and read again a step for an 8B model: ~10 ms of a 2,048-row step, the fixed cost of
every short one. Where the card has the room, each matrix is expanded once at start and kept
(engine/kernels/dequant_launch.py keep), and a step reads it as it is. The values are the very bits the per-step
expansion writes (the same kernel), so nothing a request computes changes.

They take 2 bytes a weight beside the blocks (13 GiB for an 8B model), memory the KV pool would otherwise have, so by
default (`--prompt-weights auto`) they are kept only where that is at most a quarter of the memory the weights leave
(within --gpu-memory) and the longest request's KV rows (or --kv-tokens), the prompt scratch and the reserve still
fit beside them (the memory plan decides: engine/kvcache/sizing.py plan_context);
never for a model whose running requests hold recurrent states (a hybrid's: that room sizes how many run at once),
nor across several GPUs (--tp). `resident` keeps them whatever the room, `per-step` never."""
from __future__ import annotations

from dataclasses import dataclass

MODES = ("auto", "resident", "per-step")
KEEP_SHARE = 4  # auto: the expansions take at most 1/KEEP_SHARE of the memory free after the weights


@dataclass(frozen=True)
class Room:
    """What the decision weighs, in bytes: the device memory free after the weights (within --gpu-memory), and what
    must still fit beside the expansions (the longest request's KV rows, a prompt step's scratch, the reserve)."""
    free: int
    beside: int


@dataclass(frozen=True)
class Expansions:
    """A GPU engine's prompt weights as the memory plan weighs them (engine/kvcache/sizing.py plan_context): the
    mode asked, their fp16 bytes, the tensor-parallel ranks."""
    mode: str
    nbytes: int
    tp: int = 1

    def kept(self, room: Room, stateful: bool) -> bool:
        return keep_expanded(self.mode, self.nbytes, room, stateful, self.tp)


def keep_expanded(mode: str, expansions: int, room: Room, stateful: bool = False, tp: int = 1) -> bool:
    """Whether a GPU engine keeps its prompt weights expanded (`expansions`: their fp16 bytes)."""
    if mode not in MODES:
        raise ValueError(f"--prompt-weights must be one of {', '.join(MODES)}, got {mode!r}")
    if mode != "auto" or not expansions:
        return mode == "resident" and expansions > 0
    return (not stateful and tp == 1 and expansions * KEEP_SHARE <= room.free
            and room.free - expansions >= room.beside)


def describe(expansions: int, count: int, seconds: float) -> str:
    """The start-up log's line."""
    return (f"prompt weights kept expanded: {count} matrices, {expansions / 2**30:.2f} GiB in fp16 beside their "
            f"blocks ({seconds:.1f} s; --prompt-weights per-step gives the room to the KV pool)")
