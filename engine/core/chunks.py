"""Absolute chunks, the rule a prompt read's exactness rests on: chunk k of a prompt covers positions
[k*chunk, (k+1)*chunk), whatever was read before, so a read resumed at a boundary, or one that starts
after a cached prefix, runs the same shapes in the same order as the uninterrupted read (docs/DESIGN.md,
"Exactness")."""
from __future__ import annotations

DELTA_CHUNK = 64  # positions of one chunk of the delta rule's chunked form (a hybrid's reads: engine/ops/delta_rule.py,
# engine/kernels/linear_attention.cu), at absolute multiples: a KV block's size


def chunk_end(pos: int, total: int, chunk: int) -> int:
    """Chunk k covers [k*chunk, (k+1)*chunk): a read resumed at a boundary runs the same shapes."""
    return min((pos // chunk + 1) * chunk, total)


def step_budget(step_tokens: int | None, chunk: int) -> int:
    """Prompt rows one step may take from several reads where rows do not depend on the step
    (--step-tokens; default two chunks: a newcomer's read goes beside a long read's chunk)."""
    return step_tokens or 2 * chunk
