"""Answers read again for the prefix cache take at most a few rows of a step (engine/loop/step_plan.py SETTLE_ROWS):
a request that comes while they are read waits for a step that small at most, its own steps carry no more of
them, and a long read is never held back a step for them as for a short request. The engine's loop in this process
over the real runner and a small synthetic model of the default model's type (its rows the same in any step on the
CPU, so answers are read again and reads share steps); the newcomer's GEN put in as the answers end."""

import pytest

from engine.loop.loop import EngineLoop
from engine.loop.park_policy import ParkPolicy
from protocol import messages as m
from tests.engine.loop.hybrid_runner import SMALL_CHUNK, small_runner, tokens

CHUNK, CAP = SMALL_CHUNK, 16
GREEDY = {"temperature": 0.0, "seed": 0}
# two requests whose answers (their whole blocks: 48 rows past each 16-token prompt) are read again together, and a
# newcomer of three chunks
ANSWERS = [m.Gen(60, tuple(range(300, 316)), GREEDY, 1), m.Gen(60, tuple(range(500, 516)), GREEDY, 3)]
B = m.Gen(4, tuple(range(900, 900 + 3 * CHUNK)), {**GREEDY, "reuse": 0}, 2)


@pytest.fixture(scope="module")
def runner(small_q4_1):
    return small_runner(small_q4_1, blocks=64)  # (room for all: no answer's read let go for the newcomer)


def serve(runner, settle_rows: int) -> tuple[list, list]:
    """ANSWERS served together, B put in as the last of their DONEs is written; (the loop's lines, each prompt step's
    [(id, answer read again, rows)])."""
    out, steps = [], []

    def write(msg):
        out.append(msg)
        if isinstance(msg, m.Done) and sum(isinstance(x, m.Done) for x in out) == len(ANSWERS):
            loop.inbox.put(B)

    loop = EngineLoop(runner, ParkPolicy(), write)
    loop.rounds.plan.settle_rows = settle_rows
    read_step = loop.rounds.read_step

    def recorded(pieces, outer=()):
        steps.append([(seq.id, seq.settling, end - seq.pos) for seq, end in pieces])
        read_step(pieces, outer)

    loop.rounds.read_step = recorded
    for gen in ANSWERS:
        loop.control(gen)
    while loop.busy or not loop.inbox.empty():
        loop.take_lines(block=False)
        loop.round()
    assert not any(isinstance(x, (m.Err, m.Defer)) for x in out) and loop.requests.settling() == 0
    return out, steps


def settle_rows(steps: list) -> list[int]:
    """Each step's rows of answers read again."""
    return [sum(rows for _, settling, rows in step if settling) for step in steps]


def test_answers_read_again_take_at_most_their_rows_a_step_and_the_newcomer_loses_nothing(runner):
    uncapped_out, uncapped = serve(runner, 10**6)
    out, steps = serve(runner, CAP)
    assert all(len(tokens(out, gen.id)) == gen.max_new for gen in ANSWERS)
    assert tokens(out, B.id) == tokens(uncapped_out, B.id)
    per_step = settle_rows(steps)
    assert sum(per_step) == sum(settle_rows(uncapped)) == 2 * 48  # every answer's whole blocks read, either way
    assert max(per_step) <= CAP < max(settle_rows(uncapped))  # (uncapped, a step takes more of them)
    with_b = [i for i, step in enumerate(steps) if any(ident == B.id for ident, _, _ in step)]
    assert with_b and max(settle_rows([steps[i] for i in with_b])) <= CAP
    assert with_b == list(range(with_b[0], with_b[-1] + 1))  # never held back a step for them (held_back)
