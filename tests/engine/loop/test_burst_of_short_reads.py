"""A burst of short reads (each a chunk or less past its cached prefix) beside a decoder: with a burst budget the
decoder's next token waits for their first tokens, up to that long, their steps neither paused nor cut for it
(engine/loop/step_limits.py wait_ms, engine/loop/rounds.py); a long read's steps still pause for it at the interval;
with no budget, or before the decoder has had as long at its own pace as the last burst held it, the burst's steps
pause as any. Every request's tokens are those it has alone. The engine's loop in this process over the real runner
and a tiny qwen3next file (its rows the same in any step on the CPU), the decoder given a step at every layer of a
read where the interval rules (0.01 ms)."""

import pytest

from engine.loop.loop import EngineLoop
from engine.loop.park_policy import ParkPolicy
from engine.loop.step_limits import StepLimits
from protocol import messages as m
from tests.engine.loop.hybrid_runner import hybrid_runner, serve_until_idle, tokens
from tests.engine.model.test_hybrid import CHUNK

GREEDY = {"temperature": 0.0, "seed": 0, "reuse": 0}
D = m.Gen(40, tuple(range(40, 60)), GREEDY, 1)  # the decoder
SHORTS = [m.Gen(3, tuple(range(1000 + 50 * i, 1040 + 50 * i)), GREEDY, 10 + i) for i in range(6)]  # two steps' reads
A = m.Gen(3, tuple(range(300, 300 + 4 * CHUNK)), GREEDY, 2)  # a long read: two steps of its own
BUDGET = 60_000.0  # ms: the whole burst within it


@pytest.fixture(scope="module")
def runner(tmp_path_factory):
    return hybrid_runner(tmp_path_factory.mktemp("hybrid"), max_running=8)


def serve(runner, first: list[m.Gen], then: list[m.Gen], burst_ms: float, idle_s: float = 0.0,
          burst_in_s: float = 0.0) -> list:
    """The loop's lines for `first` given at once and `then` after the first round; idle_s: the decoders' last step
    that long before; burst_in_s: a burst may hold them again only that long after the start."""
    out: list = []
    loop = EngineLoop(runner, ParkPolicy(), out.append, limits=StepLimits(interval_ms=0.01, burst_ms=burst_ms))
    loop.rounds.pauses.decoded_at = loop.rounds.pauses.clock() - idle_s
    loop.rounds.pauses.burst_free_at = loop.rounds.pauses.clock() + burst_in_s
    return serve_until_idle(loop, first, then, out)



def decoder_tokens_while_read(out: list, gens: list[m.Gen]) -> int:
    """D's tokens from the first of gens' prompt progress lines to the last of their first tokens."""
    ids = {gen.id for gen in gens}
    start = next(i for i, x in enumerate(out) if isinstance(x, m.PromptProgress) and x.id in ids)
    end = max(next(i for i, x in enumerate(out) if isinstance(x, m.Token) and x.id == ident) for ident in ids)
    return sum(isinstance(x, m.Token) and x.id == D.id for x in out[start:end])


def prompt_steps(out: list, gens: list[m.Gen]) -> int:
    """How many prompt steps read gens: runs of their progress lines that nothing else separates."""
    ids, steps, inside = {gen.id for gen in gens}, 0, False
    for x in out:
        ours = isinstance(x, m.PromptProgress) and x.id in ids
        steps, inside = steps + (ours and not inside), ours
    return steps


def test_a_burst_of_short_reads_goes_before_the_decoders_next_token_within_the_budget(runner):
    burst, paced = serve(runner, [D], SHORTS, BUDGET), serve(runner, [D], SHORTS, 0.0)
    assert prompt_steps(burst, SHORTS) >= 2  # (the burst is more than one step)
    assert decoder_tokens_while_read(burst, SHORTS) == 0
    assert decoder_tokens_while_read(paced, SHORTS) >= 2  # without a budget, their steps pause for the decoder
    for gen in (D, *SHORTS):
        alone = tokens(serve(runner, [gen], [], 0.0), gen.id)
        assert tokens(burst, gen.id) == tokens(paced, gen.id) == alone and len(alone) == gen.max_new


def test_a_long_read_pauses_for_the_decoder_whatever_the_burst_budget(runner):
    """Its last chunk too: a chunk or less from its end, but not a short read."""
    out = serve(runner, [D], [A], BUDGET)
    reads = [i for i, x in enumerate(out) if isinstance(x, m.PromptProgress) and x.id == A.id]
    between = [sum(isinstance(x, m.Token) and x.id == D.id for x in out[i:j]) for i, j in zip(reads, reads[1:])]
    assert len(reads) == 4 and all(n >= 1 for n in between), between
    assert tokens(out, A.id) == tokens(serve(runner, [A], [], 0.0), A.id)


def test_the_budget_is_spent_then_the_decoder_steps_between_the_bursts_steps(runner):
    """A budget shorter than the burst's first step: the decoder waits no longer for it than without one."""
    out = serve(runner, [D], SHORTS, 1e-6)
    assert decoder_tokens_while_read(out, SHORTS) >= 2



def test_after_idle_reads_the_budget_counts_from_the_first_decoders_first_tokens(runner):
    """The decoders' last step long before (past the budget) and nobody decoding when a burst comes: the first step's
    requests decode from then on, and the budget counts from their first tokens, not from that last step (an earlier
    run's answers read again for the cache had spent a burst's budget: eighteenth session). Their second tokens come
    after the burst's first tokens."""
    out = serve(runner, SHORTS, [], BUDGET / 2, idle_s=BUDGET / 1000)
    at = [[i for i, x in enumerate(out) if isinstance(x, m.Token) and x.id == gen.id] for gen in SHORTS]
    early, rest = at[:3], at[3:]  # (the first step reads three: 120 rows of its 128)
    assert prompt_steps(out, SHORTS) >= 2 and max(r[0] for r in rest) < min(e[1] for e in early)


def test_a_burst_holds_the_decoder_again_only_after_as_long_at_its_own_pace(runner):
    """The last burst held the decoder past the interval, and the time it has since had at its pace is shorter: the
    next burst's steps pause for it as any (a stream of short reads that never ends would otherwise leave it a token
    a budget)."""
    out = serve(runner, [D], SHORTS, BUDGET, burst_in_s=BUDGET / 1000)
    assert decoder_tokens_while_read(out, SHORTS) >= 2


def test_after_a_burst_the_next_waits_as_long_as_it_held_the_decoder(runner):
    """The burst's round leaves the next burst's start about the decoder's wait past the interval ahead of that wait's
    end (the decoder's step after the burst's first tokens: its start less the step before's end)."""
    out: list = []
    loop = EngineLoop(runner, ParkPolicy(), out.append, limits=StepLimits(interval_ms=0.01, burst_ms=BUDGET))
    clock, steps = loop.rounds.pauses.clock, []
    decode_step = loop.rounds.decoding.step

    def stamped(decoding):  # each decode step: its start, the next burst's start then, the lines so far, its end
        began, free_at, lines = clock(), loop.rounds.pauses.burst_free_at, len(out)
        decode_step(decoding)
        steps.append((began, free_at, lines, clock()))

    loop.rounds.decode_step = stamped
    serve_until_idle(loop, [D], SHORTS, out)
    burst_end = max(next(i for i, x in enumerate(out) if isinstance(x, m.Token) and x.id == gen.id) for gen in SHORTS)
    k = next(k for k, (*_, lines, _) in enumerate(steps) if lines > burst_end)  # the decoder's first step after it
    (after, free_at, _, _), held = steps[k], steps[k][0] - steps[k - 1][3]
    assert decoder_tokens_while_read(out, SHORTS) == 0 and free_at >= after + 0.5 * held > after
