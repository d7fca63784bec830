"""A decode step's token lines written while the device runs the next forward (DecodeSteps.step, runner.runs_async):
the same lines for every request as when they are written before it, each request's in order, its DONE after its
last token, and the lines of the requests that go on written inside the forward. On the CPU the forward is not
asynchronous; runs_async set by hand drives the same path (the lines then go out after the eager step)."""
import pytest

from engine.loop.loop import EngineLoop
from engine.loop.park_policy import ParkPolicy
from protocol import messages as m
from tests.engine.loop.hybrid_runner import serve_until_idle, small_runner

GREEDY = {"temperature": 0.0, "seed": 0}
SEEDED = {"temperature": 0.9, "seed": 11}


def gens() -> list[m.Gen]:
    """Requests that end at different steps (max_new), greedy and seeded, one asking log-probabilities."""
    return [m.Gen(9, (300, 301, 302), GREEDY, 1), m.Gen(4, (400, 401), SEEDED, 2),
            m.Gen(12, (500, 501, 502, 503), SEEDED | {"logprobs": 2}, 3), m.Gen(6, (600,), GREEDY, 4)]


def serve(runner, runs_async: bool, requests=gens) -> tuple[list, list[tuple[int, int]]]:
    """The loop's lines for requests(), and for each decode forward the lines written (before, after) it ran."""
    runner.runs_async = runs_async
    out: list = []
    forwards: list[tuple[int, int]] = []
    decode_batch = runner.decode_batch

    def watched(seqs, meanwhile=None):
        before = len(out)
        decode_batch(seqs, meanwhile)
        forwards.append((before, len(out)))
    runner.decode_batch = watched
    try:
        serve_until_idle(EngineLoop(runner, ParkPolicy(), out.append), requests(), [], out)
    finally:
        runner.decode_batch = decode_batch
    return out, forwards


def per_request(out: list) -> dict[int, list]:
    """Each request's lines in order: its tokens (with log-probabilities) and its DONE last."""
    lines: dict[int, list] = {}
    for x in out:
        if isinstance(x, m.Token):
            lines.setdefault(x.id, []).append((x.token, x.logprob, x.top))
        elif isinstance(x, m.Done):
            lines.setdefault(x.id, []).append("DONE")
    return lines


@pytest.fixture(scope="module")
def runner(small_q4_1):
    return small_runner(small_q4_1, blocks=64)


def test_lines_written_during_the_forward_are_the_lines_written_before_it(runner):
    before, forwards_before = serve(runner, runs_async=False)
    during, forwards_during = serve(runner, runs_async=True)
    assert per_request(during) == per_request(before)
    assert all(lines[-1] == "DONE" and "DONE" not in lines[:-1] for lines in per_request(during).values())
    assert [len(lines) - 1 for _, lines in sorted(per_request(during).items())] == [9, 4, 12, 6]
    assert all(a == b for a, b in forwards_before)  # (before: nothing written while a forward runs)
    assert sum(b > a for a, b in forwards_during) >= 8  # the lines of the requests going on, inside each forward


def test_a_request_paused_for_memory_has_the_same_tokens_with_its_lines_written_meanwhile(small_q4_1):
    """Four requests in a pool too small for them all: the newest pauses (its rows to host memory) and comes
    back; the lines held for the forward are written whatever the pauses."""
    def longer() -> list[m.Gen]:  # (10-token prompts, 30 tokens each: two blocks of 16 a request, 8 for 4)
        return [m.Gen(30, tuple(range(100 * i, 100 * i + 10)), SEEDED | {"seed": i}, i) for i in range(1, 5)]
    tight = small_runner(small_q4_1, blocks=6)
    before, _ = serve(tight, runs_async=False, requests=longer)
    during, _ = serve(tight, runs_async=True, requests=longer)
    assert any(isinstance(x, m.Info) and x.fields.get("paused") == "1" for x in during)
    assert per_request(during) == per_request(before)
