"""A hybrid's recurrent states are made in the room the memory plan set aside for --max-running requests
(engine/kvcache/state_memory.py): an answer read again for the prefix cache holds two states as a request does, and
gives them up to a new request (engine/loop/admission.py state_room). The engine's loop in this process over the
real runner and a tiny qwen3next file, one running request at most, the new request's GEN put in while the answer's
read again is in its step."""

import pytest

from engine.loop.loop import EngineLoop
from engine.loop.park_policy import ParkPolicy
from protocol import messages as m
from tests.engine.loop.hybrid_runner import hybrid_runner, tokens

GREEDY = {"temperature": 0.0, "seed": 0}
A, B = list(range(300, 450)), list(range(900, 960))


@pytest.fixture(scope="module")
def runner(tmp_path_factory):
    return hybrid_runner(tmp_path_factory.mktemp("hybrid"), max_running=1)


def serve(runner, gens: list[m.Gen], on_line=None) -> tuple[EngineLoop, list]:
    """A loop given `gens`, run until every request is done; on_line(loop, line) for each line it writes."""
    out = []

    def write(msg):
        out.append(msg)
        if on_line is not None:
            on_line(loop, msg)

    loop = EngineLoop(runner, ParkPolicy(), write)
    for gen in gens:
        loop.control(gen)
    while loop.busy or not loop.inbox.empty():
        loop.take_lines(block=False)
        loop.round()
    return loop, out



def test_a_new_request_takes_the_room_of_an_answer_read_again(runner):
    alone = tokens(serve(runner, [m.Gen(8, tuple(B), {**GREEDY, "reuse": 0}, 2)])[1], 2)
    dropped = []  # (id, still reading) of each answer read again let go

    def b_arrives(loop, line):  # B's GEN comes as A ends: its answer (200 tokens) is read again, a few steps long
        if isinstance(line, m.Done) and line.id == 1:
            let_go = loop.memory.drop_settling
            loop.memory.drop_settling = lambda seq: (dropped.append((seq.id, seq.reading)), let_go(seq))
            loop.inbox.put(m.Gen(8, tuple(B), {**GREEDY, "reuse": 0}, 2))

    loop, out = serve(runner, [m.Gen(200, tuple(A), GREEDY, 1)], b_arrives)
    assert len(tokens(out, 1)) == 200 and tokens(out, 2) == alone
    assert not any(isinstance(x, (m.Err, m.Defer)) for x in out)
    assert dropped[0] == (1, True)  # A's read again let go before its end, for B (B's own, later, to its end)
    assert loop.requests.settling() == 0 and loop.memory.let_go == []


def test_an_ended_request_gives_its_states_back_at_once(runner):
    """A request's two recurrent states go back to their pool when it ends (its answer read again ends too),
    not when the last reference to it goes: the room its successor's states are made in."""
    seqs = []

    def taken(loop, line):  # each request as the engine took it
        if isinstance(line, m.Info) and line.id in loop.requests.seqs:
            seqs.append(loop.requests.seqs[line.id])

    for gen in (m.Gen(70, tuple(A), GREEDY, 1), m.Gen(8, tuple(B), {**GREEDY, "reuse": 0}, 2)):
        assert tokens(serve(runner, [gen], taken)[1], gen.id)
    assert [seq.id for seq in seqs] == [1, 2] and seqs[0].settling  # (A's answer was read again)
    assert all(seq.state is None for seq in seqs)  # A's after its answer's read again, B's at its DONE
