"""A step that a short read leads (engine/loop/step_plan.py burst_rows): the reads that end in it take a chunk's rows in
all, so a burst of short reads goes a few a step and the first are answered after a short one, while a long read
behind a short one still takes its piece of the step; every request's tokens are those it has alone. The engine's
loop in this process over the real runner and a tiny llama file on the CPU (its rows the same in any step)."""
import subprocess
import sys

import pytest

from engine.loop.loop import EngineLoop
from engine.loop.park_policy import ParkPolicy
from engine.loop.step_limits import StepLimits
from engine.model.weights import load_model
from engine.ops.backend import cpu_backend
from engine.runner.runner import ModelRunner
from protocol import messages as m
from tests.harness import ROOT

CHUNK, STEP = 64, 256
GREEDY = {"temperature": 0.0, "seed": 0, "reuse": 0}
BURST = [m.Gen(3, tuple(range(100 + 40 * i, 130 + 40 * i)), GREEDY, 10 + i) for i in range(6)]  # 30 rows each
LONG = m.Gen(3, tuple(range(2000, 2300)), GREEDY, 30)  # five chunks


@pytest.fixture(scope="module")
def runner(tmp_path_factory):
    path = tmp_path_factory.mktemp("burst") / "tiny.gguf"
    subprocess.run([sys.executable, str(ROOT / "tools/fixtures/make_synthetic_gguf.py"), str(path), "--preset", "tiny",
                    "--type", "F16", "--seed", "3"], check=True, capture_output=True)
    backend = cpu_backend()
    cfg, weights, _ = load_model(str(path), backend)
    runner = ModelRunner(cfg, weights, backend, ctx=1024, chunk=CHUNK, eos_ids=frozenset(), max_running=8)
    runner.warm_up()
    assert runner.shape_free
    return runner


def serve(runner, gens: list[m.Gen]) -> tuple[list, list[list[tuple[int, int]]]]:
    """The loop's lines for gens given at once, and each prompt step's (request, rows) pieces."""
    out, steps = [], []
    loop = EngineLoop(runner, ParkPolicy(), out.append, limits=StepLimits(step_tokens=STEP))
    read_step = loop.rounds.read_step

    def recorded(pieces, outer=()):
        steps.append([(seq.id, end - seq.pos) for seq, end in pieces])
        read_step(pieces, outer)

    loop.rounds.read_step = recorded
    for gen in gens:
        loop.control(gen)
    while loop.busy:
        loop.round()
    assert not any(isinstance(x, (m.Err, m.Defer)) for x in out), out
    return out, steps


def tokens(out, ident: int) -> list[int]:
    return [x.token for x in out if isinstance(x, m.Token) and x.id == ident]


def test_a_burst_of_short_reads_goes_a_chunk_of_rows_a_step_with_the_tokens_each_has_alone(runner):
    out, steps = serve(runner, BURST)
    assert [[ident for ident, _ in step] for step in steps] == [[10, 11], [12, 13], [14, 15]]  # 60 rows a step
    first = [next(i for i, x in enumerate(out) if isinstance(x, m.Token) and x.id == gen.id) for gen in BURST]
    assert first == sorted(first) and first[1] < first[2]  # the first two answered before the next step
    for gen in BURST:
        assert tokens(out, gen.id) == tokens(serve(runner, [gen])[0], gen.id) and len(tokens(out, gen.id)) == 3


def test_a_long_read_behind_a_short_one_still_takes_its_piece_of_the_step(runner):
    out, steps = serve(runner, [BURST[0], LONG, BURST[1], BURST[2]])
    assert steps[0] == [(10, 30), (30, CHUNK), (11, 30)]  # the long read's chunk, then a short read within a chunk
    assert (12, 30) not in steps[0]  # (its rows past the chunk the short reads take in all)
    for gen in (BURST[0], LONG):
        assert tokens(out, gen.id) == tokens(serve(runner, [gen])[0], gen.id)
