"""Speculative decoding's drafts where a request's grammar has its say (issue 47): a constrained answer (a forced
tool call, a JSON schema) has stretches the grammar allows alone (`{"name":"edit_file","arguments":{"path":"` is ten
tokens of Qwen2.5's vocabulary that no model picks), drafted whole: each such row is kept unless the model spells the
same text with other tokens, so where a row costs less than a step (cost < 1, engine/runner/row_cost.py) they pay
whatever the request's record. Elsewhere a drafter's tokens are cut where the grammar would refuse one (its row
could never be kept). Both only propose: the tokens are drawn from the rows as always (engine/loop/decode_steps.py),
the mask applied at each, so the answer is the one without drafts.

Forced drafts replace the drafter's only where it watches (the n-gram one): a draft model's drafter counts its own
drafted rows as its context (ModelDrafter.verified), which tokens from elsewhere would make wrong."""
from __future__ import annotations

from engine.runner.sequence import Sequence


def forced_drafts(seq: Sequence, room: int, cost: float) -> list[int]:
    """Up to `room` tokens seq's grammar allows alone after its newest token ([] without a grammar, where the next
    token is the model's choice, where no row pays (cost >= 1), or for a drafter that cannot take them)."""
    constraint = seq.sampler.constraint
    if constraint is None or cost >= 1.0 or room <= 0 or not seq.drafter.watches:
        return []
    return constraint.forced()[:room]


def allowed_drafts(seq: Sequence, drafts: list[int]) -> list[int]:
    """drafts up to the first the grammar would refuse after the ones before it (all of them without a grammar)."""
    constraint = seq.sampler.constraint
    if constraint is None or not drafts:
        return drafts
    return drafts[: constraint.allowed_run(drafts)]
