"""A short request that comes while a long prompt step pauses for the decoders is read in that pause, in a step of
its own, where rows do not depend on the step (engine/loop/rounds.py read_newcomers): its first token comes before
the long step's end, and every request's tokens are those it has alone; but not before a step of several short reads
that its read would hold up longer than it would wait. The engine's loop in this process over the
real runner and a tiny qwen3next file (its rows the same in any step on the CPU), the decoders given a step at
every layer of a read (a decode interval of 0.01 ms)."""

import pytest

from engine.loop.loop import EngineLoop
from engine.loop.park_policy import ParkPolicy
from engine.loop.step_limits import StepLimits
from protocol import messages as m
from tests.engine.loop.hybrid_runner import hybrid_runner, serve_until_idle, tokens
from tests.engine.model.test_hybrid import CHUNK

GREEDY = {"temperature": 0.0, "seed": 0, "reuse": 0}
D = m.Gen(60, tuple(range(40, 60)), GREEDY, 1)  # a decoder
A = m.Gen(4, tuple(range(300, 300 + 5 * CHUNK)), GREEDY, 2)  # a long read: five steps
B = m.Gen(6, tuple(range(900, 930)), GREEDY, 3)  # the newcomer
SHORT = [m.Gen(3, tuple(range(1000 + 50 * i, 1040 + 50 * i)), GREEDY, 10 + i) for i in range(3)]  # one step's reads


@pytest.fixture(scope="module")
def runner(tmp_path_factory):
    return hybrid_runner(tmp_path_factory.mktemp("hybrid"), max_running=5)


def serve(runner, gens: list[m.Gen], arrives: m.Gen | None = None, during: int = A.id, then: tuple = ()) -> list:
    """The loop's lines for `gens` given at once, `then` after the first round, and `arrives` put in at the first
    pause of a step reading `during`."""
    out = []
    loop = EngineLoop(runner, ParkPolicy(), out.append, limits=StepLimits(interval_ms=0.01))
    decode_step = loop.rounds.pauses.decode_step

    def in_a_pause(decoding):
        nonlocal arrives
        if arrives is not None and any(seq.id == during for seq in loop.requests.in_step):
            loop.inbox.put(arrives)
            out.append("arrived")
            arrives = None
        decode_step(decoding)

    loop.rounds.pauses.decode_step = in_a_pause
    return serve_until_idle(loop, gens, list(then), out)



def test_a_newcomer_is_read_in_a_pause_of_the_long_step_with_the_tokens_it_has_alone(runner):
    out = serve(runner, [D, A], arrives=B)
    at = out.index("arrived")
    b_first = next(i for i, x in enumerate(out) if isinstance(x, m.Token) and x.id == B.id)
    a_step_end = next(i for i, x in enumerate(out) if i > at and isinstance(x, m.PromptProgress) and x.id == A.id)
    assert at < b_first < a_step_end  # B's first token before the end of the step it came in
    assert a_step_end < next(i for i, x in enumerate(out) if i > a_step_end and isinstance(x, m.PromptProgress)
                             and x.id == A.id)  # (A read on after it: B came in its first steps)
    for gen in (D, A, B):
        assert tokens(out, gen.id) == tokens(serve(runner, [gen]), gen.id) and len(tokens(out, gen.id)) == gen.max_new


def test_a_newcomer_waits_for_a_step_of_short_reads_its_own_read_would_hold_up_longer(runner):
    """Three reads of 40 rows share a step beside a decoder; a fourth of 40 comes in its first pause: read first,
    it would hold the three up for its whole read to save itself the step's last three quarters. Each first token of
    the three comes before the newcomer's, and every request's tokens are its own."""
    out = serve(runner, [D], arrives=B, during=SHORT[0].id, then=SHORT)
    at = out.index("arrived")
    step_end = [next(i for i, x in enumerate(out) if isinstance(x, m.Token) and x.id == gen.id) for gen in SHORT]
    b_first = next(i for i, x in enumerate(out) if isinstance(x, m.Token) and x.id == B.id)
    assert at < max(step_end) < b_first
    for gen in (D, *SHORT, B):
        assert tokens(out, gen.id) == tokens(serve(runner, [gen]), gen.id) and len(tokens(out, gen.id)) == gen.max_new


def test_newcomers_at_every_pause_hold_the_long_step_no_longer_than_its_own_time_left(runner):
    """A newcomer comes at each pause of A's first step; by the estimates (10 ms each, 25 ms of A's step left at each
    pause, pinned here) the first two are read in its pauses, the third after it: the newcomers' reads in one step's
    pauses stay under the time its own reads have left (64 clients' prompts, a few at each pause, held a step of two
    for 0.9-1.7 s). Every request's tokens are its own."""
    news = [m.Gen(3, tuple(range(1200 + 20 * i, 1210 + 20 * i)), GREEDY, 20 + i) for i in range(3)]
    out, coming = [], list(news)
    loop = EngineLoop(runner, ParkPolicy(), out.append, limits=StepLimits(interval_ms=0.01))
    pauses, decode_step = loop.rounds.pauses, loop.rounds.pauses.decode_step
    pauses.estimate_ms = lambda seq, rows: 10.0
    pauses.newcomers = lambda left_ms: loop.rounds.read_newcomers(25.0)

    def in_a_pause(decoding):
        if coming and any(seq.id == A.id for seq in loop.requests.in_step):
            loop.inbox.put(coming.pop(0))
            out.append("arrived")
        decode_step(decoding)

    pauses.decode_step = in_a_pause
    for gen in (D, A):
        loop.control(gen)
    while loop.busy or not loop.inbox.empty():
        loop.take_lines(block=False)
        loop.round()
    assert not coming and not any(isinstance(x, (m.Err, m.Defer)) for x in out), out
    at = out.index("arrived")
    a_step_end = next(i for i, x in enumerate(out) if i > at and isinstance(x, m.PromptProgress) and x.id == A.id)
    assert out[at:a_step_end].count("arrived") == 3  # all three came in the pauses of one step of A's
    first = [next(i for i, x in enumerate(out) if isinstance(x, m.Token) and x.id == gen.id) for gen in news]
    assert first[0] < first[1] < a_step_end < first[2]
    for gen in (A, *news):
        assert tokens(out, gen.id) == tokens(serve(runner, [gen]), gen.id) and len(tokens(out, gen.id)) == gen.max_new
