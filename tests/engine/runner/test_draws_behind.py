"""A decode forward's plain sampling rows drawn behind it (engine/runner/picks.py Picks.behind, DrawsBehind): which
rows go, each request's uniform taken once for its token (the one its draw at the next step would take), none taken
where the draws cannot be queued, the tokens into seq.picked once collected. The GPU's draws themselves are
BatchDraws' (tools/device/draws_behind_check.py holds the engine to the same tokens either way on a GPU); here a
stand-in records what would be queued."""
from types import SimpleNamespace

import numpy as np

from engine.ops.backend import cpu_backend
from engine.runner.picks import DrawsBehind, Picks
from engine.runner.sampler import Sampler, SamplingParams
from engine.runner.sequence import Sequence


class StandIn:
    """BatchDraws' surface: a launch records its rows and gathered rows; collect gives each row's uniform scaled
    to a token (a function of what the draw reads, as the kernels' tokens are)."""
    rows = 64

    def __init__(self, ready: bool = True):
        self.cp = SimpleNamespace(cuda=SimpleNamespace(get_current_stream=lambda: "forward's stream"))
        self.is_ready, self.launches = ready, []

    def key(self, params):
        return len(params), all(0 < p.top_k <= 256 for p in params)

    def ready(self, size, top):
        return self.is_ready

    def launch(self, rows, gather, stream):
        self.launches.append(([u for _, _, u in rows], gather[1], stream))
        return True

    def collect(self, n, stream):
        uniforms = self.launches[-1][0]
        return [int(u * 1000) for u in uniforms[:n]]


def request(ident: int, **params) -> Sequence:
    p = SamplingParams(**({"temperature": 0.8, "top_k": 40, "seed": ident} | params))
    return Sequence(id=ident, prompt=(1, 2), max_new=8, sampler=Sampler(p, (1, 2)), stop_ids=frozenset())


def picks_with(batch) -> Picks:
    picks = Picks(cpu_backend(), None, 32)  # (on the CPU: no batched draws of its own)
    assert picks.behind([request(1)], [0]) is None
    picks.batch = batch
    return picks


def uniforms(ident: int, n: int) -> list[float]:
    return list(np.random.Generator(np.random.PCG64(ident)).random(n))


def test_the_plain_sampling_rows_go_behind_the_forward_each_from_its_first_row():
    greedy, drafted, replaying, penalized = request(2, temperature=0.0), request(3), request(4), \
        request(5, repeat_penalty=1.1)
    drafted.drafts, replaying.replay = [7, 8], [9]
    a, b = request(1), request(6)
    batch = StandIn()
    behind = picks_with(batch).behind([a, greedy, drafted, replaying, penalized, b], [0, 1, 2, 5, 6, 7])
    assert [seq for seq, _ in behind.rows] == [a, b]
    behind.launch("logits")
    assert batch.launches == [([uniforms(1, 1)[0], uniforms(6, 1)[0]], [0, 7], "forward's stream")]
    assert a.picked is None  # (until the forward is waited for)
    behind.collect()
    assert (a.picked, b.picked) == (int(uniforms(1, 1)[0] * 1000), int(uniforms(6, 1)[0] * 1000))
    assert a.sampler.uniform() == uniforms(1, 2)[1]  # one uniform taken for the token drawn behind, no more


def test_a_forward_redone_draws_again_with_the_same_uniforms():
    a = request(1)
    batch = StandIn()
    behind = picks_with(batch).behind([a], [0])
    behind.launch("logits")
    behind.launch("the eager step's logits")
    assert batch.launches[0][0] == batch.launches[1][0] == [uniforms(1, 1)[0]]
    assert a.sampler.uniform() == uniforms(1, 2)[1]


def test_nothing_is_drawn_or_taken_where_the_draws_cannot_be_queued():
    """Their graph not captured yet (a capture waits for the device: not with a forward in flight): the next
    step draws them as before, with the uniform a draw behind would have taken."""
    a = request(1)
    behind = picks_with(StandIn(ready=False)).behind([a], [0])
    behind.launch("logits")
    behind.collect()
    assert a.picked is None
    assert a.sampler.uniform() == uniforms(1, 1)[0]


def test_no_draws_behind_for_a_step_without_plain_sampling_rows():
    picks = picks_with(StandIn())
    assert picks.behind([request(2, temperature=0.0), request(3, presence_penalty=0.5)], [0, 1]) is None
    assert isinstance(picks.behind([request(4)], [0]), DrawsBehind)
