"""How many tokens a request's drafter proposes at its next step (speculative decoding, issue 47): the k that
gives the request the most tokens per unit of step time, from two estimates.

  alphas  alpha_i, the chance that a draft's token i is the model's own when the ones before it were: the
          request's recent record per position (a draft of k with a kept tried positions 0 .. a, or 0 .. k - 1
          when all were kept), older records weighing less. A position seldom tried leans on the one before it
          (an agent's drafts come in runs: a copied passage is kept whole or missed at its start, so a draft's
          later tokens are likelier than its first). The n-gram drafter counts the drafts it could have made,
          at full length, whatever it drafts (`watch`: a lookup, checked against the tokens that came, at no
          cost), so a request whose drafts start to pay is noticed and a draft's length can grow; the draft
          model's drafts cost a forward each, so it counts its own, and a resting one probes with a single
          token now and then.
  cost    what one more row adds to the step, as a fraction of the request's share of the step's time
          (engine/runner/row_cost.py, measured on the forwards themselves; a draft model's own forwards are
          added for its drafts).

A draft of k tokens brings 1 + alpha_0 + alpha_0 alpha_1 + ... (k terms after the 1) tokens for 1 + cost * k of
the step: k is the best of 0 .. most, and 0 where no k > 0 beats one token a step (a request that gains nothing
pays nothing). On a GPU's decode, where a row costs a fifth of a one-row step or less, drafts pay from a low
alpha on; on a CPU, where each row is a pass over the weights, only runs that are nearly certain do. Both drafters
adapt and count through it: engine/runner/ngram_draft.py and engine/runner/draft_model.py."""
from __future__ import annotations

PRIOR_KEPT, PRIOR_TRIED = 1.0, 2.0  # position 0's record at first: one kept of two tried (it decays as the rest)
LEAN = 1.0  # the weight (in tries) of position i - 1's alpha in position i's
DECAY = 0.9  # an older record's weight against each newer one (the last ~10 drafts count)
PROBE_STEPS = 16  # a drafter that cannot watch for free drafts one token after this many steps without


def expected_tokens(alphas: list[float], k: int) -> float:
    """Tokens a step brings with a draft of k: the step's own and each draft token kept with all before it."""
    total, run = 1.0, 1.0
    for alpha in alphas[:k]:
        run *= alpha
        total += run
    return total


def best_k(alphas: list[float], cost: float) -> int:
    """The draft length of 0 .. len(alphas) that brings the most tokens per step time (the shortest of equals):
    expected_tokens(alphas, k) / (1 + cost k), the sum kept as k grows (a step's every request asks)."""
    best, best_rate, total, run = 0, 1.0, 1.0, 1.0
    for k, alpha in enumerate(alphas, start=1):
        run *= alpha
        total += run
        rate = total / (1.0 + cost * k)
        if rate > best_rate * (1 + 1e-9):
            best, best_rate = k, rate
    return best


class DraftPace:
    watches = False  # whether the drafter counts the drafts it could have made (the n-gram one: watch)

    def __init__(self, most: int):
        self.most = most  # the cap (--draft-max)
        self.kept, self.tried = [0.0] * most, [0.0] * most  # the decayed record per position
        self.kept[0], self.tried[0] = PRIOR_KEPT, PRIOR_TRIED
        self.idle = 0  # steps since the last draft (a probe's clock)
        self.drafted = self.accepted = 0  # totals, reported with the request's DONE

    def alphas(self) -> list[float]:
        """alpha_0 .. alpha_{most - 1}: each position's record, each after the first leaning on the one before."""
        out = [self.kept[0] / self.tried[0]]
        for kept, tried in zip(self.kept[1:], self.tried[1:]):
            out.append((kept + LEAN * out[-1]) / (tried + LEAN))
        return out

    def budget(self, cost: float) -> int:
        """The most tokens this step's draft may have, at `cost` a drafted row (a fraction of the request's
        share of the step)."""
        k = best_k(self.alphas(), cost)
        if k or self.watches or cost >= 1.0:  # (a row dearer than a step: no draft could ever pay, nor a probe)
            self.idle = 0
            return k
        self.idle += 1
        if self.idle < PROBE_STEPS:
            return 0
        self.idle = 0
        return 1  # a probe: one token, which tells whether the drafts have started to pay

    def observe(self, kept: int, tried: int) -> None:
        """A draft's positions tried (0 .. tried - 1) and kept (0 .. kept - 1), made or watched, into the record."""
        for i in range(self.most):
            self.kept[i] = self.kept[i] * DECAY + (i < kept)
            self.tried[i] = self.tried[i] * DECAY + (i < tried)

    def verified(self, proposed: int, accepted: int) -> None:
        """A draft of `proposed` tokens of which the first `accepted` were the model's own (counted in the record
        unless the drafter watches: its watch counted them)."""
        self.drafted += proposed
        self.accepted += accepted
        if not self.watches:
            self.observe(accepted, accepted + (accepted < proposed))
