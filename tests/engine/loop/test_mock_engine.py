"""The mock engine over its pipes: the whole protocol and each fault knob."""
import time

from engine.mock_engine import FAULT_EXIT_CODE
from protocol import messages as m


def gen(n_prompt: int, max_new: int, ident: int, **params) -> m.Gen:
    return m.Gen(max_new, tuple(range(10, 10 + n_prompt)), params, ident)


def test_handshake_then_chunks_tokens_and_done(engine_factory):
    e = engine_factory("--chunk", "4", mock=True)
    assert e.handshake() == m.Ready(8192, ("stop", "preempt"))  # preemption is on by default
    e.send(gen(10, 3, 1))
    got = e.read_until(m.Done)
    assert [(x.done, x.total) for x in got if isinstance(x, m.PromptProgress)] == [(4, 10), (8, 10), (10, 10)]
    assert [x.token for x in got if isinstance(x, m.Token)] == [10, 11, 12]  # the prompt echoed
    assert got[-1].finish == "length" and got[-1].generated == 3 and got[-1].id == 1


def test_picked_tokens_are_the_scripted_ones_drawn_ahead(engine_factory):
    """--picked (bench/loop_cost_bench.py): each step's tokens drawn ahead as a GPU's batched draws, no host
    sampling: the same answer, sampled requests included, down to the end token."""
    e = engine_factory("--picked", "--script", "7,8,2,9", mock=True)
    e.handshake()
    e.send(gen(3, 10, 5, temperature=0.7, seed=1))
    got = e.read_until(m.Done)
    assert [x.token for x in got if isinstance(x, m.Token)] == [7, 8, 2] and got[-1].finish == "stop"
    echo = engine_factory("--picked", mock=True)
    echo.handshake()
    echo.send(gen(6, 4, 6, temperature=0.7, seed=2))
    assert [x.token for x in echo.read_until(m.Done) if isinstance(x, m.Token)] == [10, 11, 12, 13]  # (echoed)


def test_scripted_output_stops_at_eos(engine_factory):
    e = engine_factory("--script", "7,8,2,9", mock=True)
    e.handshake()
    e.send(gen(3, 10, 5))
    got = e.read_until(m.Done)
    assert [x.token for x in got if isinstance(x, m.Token)] == [7, 8, 2]
    assert got[-1].finish == "stop"


def test_stop_ends_the_running_request_with_cancel(engine_factory):
    e = engine_factory("--chunk", "4", "--chunk-s", "0.05", mock=True)
    e.handshake()
    e.send(gen(400, 5, 2))
    e.read()  # first PP
    e.send(m.Stop(2))
    done = e.read_until(m.Done)[-1]
    assert done.finish == "cancel" and done.id == 2


def test_bad_lines_get_err_and_the_engine_keeps_serving(engine_factory):
    e = engine_factory(mock=True)
    e.handshake()
    e.send("FROB 1 2")
    assert "unknown verb" in e.read().message
    e.send("GEN 5 bogus=1 1,2 id=9")
    err = e.read()
    assert isinstance(err, m.Err) and err.id == 9 and "bogus" in err.message
    e.send(gen(2, 1, 10))
    assert e.read_until(m.Done)[-1].finish == "length"


def test_park_and_resume_when_preempt_is_on(engine_factory):
    e = engine_factory("--chunk", "4", "--chunk-s", "0.05", "--prefill-preempt", mock=True)
    assert "preempt" in e.handshake().caps
    e.send(gen(20, 2, 1, fp=1))
    e.read()
    e.send(m.Yield())
    got = e.read_until(m.Suspended)
    parked = next(x for x in got if isinstance(x, m.Fingerprint))
    e.send(m.Resume(1))
    got = e.read_until(m.Done)
    resumed = next(x for x in got if isinstance(x, m.Fingerprint))
    assert (resumed.stage, resumed.digest) == ("resume", parked.digest)
    assert got[-1].extra["parks"] == "1"


def test_fault_die_at_chunk(engine_factory):
    e = engine_factory("--chunk", "4", "--die-at-chunk", "2", mock=True)
    e.handshake()
    e.send(gen(20, 2, 1))
    e.read_until(m.PromptProgress)
    try:
        e.read()
        raise AssertionError("the engine should have died")
    except EOFError:
        pass
    assert e.proc.wait(5) == FAULT_EXIT_CODE


def test_fault_malformed_line(engine_factory):
    e = engine_factory("--chunk", "4", "--malformed-at-chunk", "1", mock=True)
    e.handshake()
    e.send(gen(8, 1, 1))
    assert [type(e.read()), type(e.read())] == [m.Info, m.Info]  # what the request holds, then the pool
    try:
        e.read()
        raise AssertionError("expected a malformed line")
    except ValueError as err:
        assert "this-is-not-a-number" in str(err)


def test_fault_no_preempt_cap_and_slow_start(engine_factory):
    started = time.monotonic()
    e = engine_factory("--prefill-preempt", "--no-preempt-cap", "--start-delay", "0.5", mock=True)
    assert e.handshake().caps == ("stop",)
    assert time.monotonic() - started >= 0.5


def test_fault_die_while_parked(engine_factory):
    e = engine_factory("--chunk", "4", "--chunk-s", "0.05", "--prefill-preempt", "--die-while-parked", mock=True)
    e.handshake()
    e.send(gen(20, 2, 1))
    e.read()
    e.send(m.Yield())
    e.read_until(m.Suspended)
    assert e.proc.wait(5) == FAULT_EXIT_CODE


def test_no_prefill_preempt_drops_the_capability(engine_factory):
    assert engine_factory("--no-prefill-preempt", mock=True).handshake().caps == ("stop",)


def test_a_continuation_goes_on_with_the_same_tokens(engine_factory):
    """GEN with the prompt plus the first k tokens and drawn=k: the answer's tail, unchanged."""
    e = engine_factory("--chunk", "4", mock=True)
    e.handshake()
    e.send(gen(6, 8, 1))
    whole = [x.token for x in e.read_until(m.Done) if isinstance(x, m.Token)]
    prompt = tuple(range(10, 16))
    e.send(m.Gen(5, prompt + tuple(whole[:3]), {"drawn": 3}, 2))
    assert [x.token for x in e.read_until(m.Done) if isinstance(x, m.Token)] == whole[3:]


def test_fault_die_at_gen_answers_nothing(engine_factory):
    e = engine_factory("--die-at-gen", "2", mock=True)
    e.handshake()
    e.send(gen(5, 1, 1))
    e.read_until(m.Done)
    e.send(gen(5, 1, 2))
    assert e.proc.wait(5) == FAULT_EXIT_CODE
    # the first request's pool report after its DONE, then the second taken (its INFO and the pool's): no PP, T or DONE
    assert [line.split()[0] for line in e.proc.stdout.read().splitlines()] == ["INFO", "INFO", "INFO"]


def test_fault_die_after_tokens(engine_factory):
    e = engine_factory("--die-after-tokens", "3", mock=True)
    e.handshake()
    e.send(gen(5, 10, 1))
    assert e.proc.wait(5) == FAULT_EXIT_CODE
    assert [line.split()[0] for line in e.proc.stdout.read().splitlines()].count("T") == 3


def test_faults_once_fire_in_the_first_process_only(engine_factory, tmp_path):
    marker = str(tmp_path / "fired")
    first = engine_factory("--die-at-chunk", "1", "--faults-once", marker, mock=True)
    first.handshake()
    first.send(gen(5, 1, 1))
    assert first.proc.wait(5) == FAULT_EXIT_CODE
    second = engine_factory("--die-at-chunk", "1", "--faults-once", marker, mock=True)
    second.handshake()
    second.send(gen(5, 1, 1))
    assert second.read_until(m.Done)[-1].finish == "length"


def test_fault_poison_token_kills_every_process(engine_factory, tmp_path):
    for _ in range(2):
        e = engine_factory("--poison-token", "12", "--faults-once", str(tmp_path / "x"), mock=True)
        e.handshake()
        e.send(gen(5, 1, 1))  # the prompt 10..14 holds 12
        assert e.proc.wait(5) == FAULT_EXIT_CODE


def test_a_short_newcomer_reads_in_a_step_of_its_own_before_the_long_reads_next_chunk(engine_factory):
    """Where reads share steps (--shape-free), a short request arriving during a long read is read alone in
    the next step and answers before the long read's next chunk: no step holds both (a step's PPs carry the
    same `ms`, the step's time), at most the step in progress of A's comes between B's GEN and B's first
    token, and A goes on right after."""
    e = engine_factory("--shape-free", "--max-running", "2", "--chunk", "64", "--step-tokens", "128", "--chunk-s",
                       "0.05", mock=True)
    e.handshake()
    e.send(gen(640, 2, 1))
    e.read_until(m.PromptProgress, ident=1)  # A's first step is written: its second is in progress
    e.send(gen(20, 2, 2))
    seen = e.read_until(m.Token, ident=2)
    rest = e.read_until(m.Done, ident=1)
    progress = [x for x in seen + rest if isinstance(x, m.PromptProgress)]
    b = next(x for x in progress if x.id == 2)
    assert b.done == 20 and all(x.ms != b.ms for x in progress if x.id == 1)  # B's step was its own
    assert len([x for x in seen if isinstance(x, m.PromptProgress) and x.id == 1]) <= 1
    assert [x.done for x in progress if x.id == 1][-1] == 640


def test_step_ms_bounds_a_reads_steps_while_others_decode_and_not_alone(engine_factory):
    """--step-ms: while a request decodes, a long read's steps take the rows their estimated time allows (the
    mock's step takes --chunk-s whatever its rows, so its estimate a row grows as its steps shrink: down to the
    floor of 256); alone, the read takes whole chunks again."""
    e = engine_factory("--shape-free", "--max-running", "2", "--chunk", "1024", "--step-tokens", "1024",
                       "--ctx", "16384", "--chunk-s", "0.02", "--token-s", "0.002", "--step-ms", "10", mock=True)
    e.handshake()
    e.send(gen(8, 400, 1))  # decoding beside the reads
    e.read_until(m.Token, ident=1)
    e.send(gen(4096, 1, 2))
    rows = [x.done for x in e.read_until(m.Done, ident=2) if isinstance(x, m.PromptProgress) and x.id == 2]
    steps = [b - a for a, b in zip([0] + rows, rows)]
    assert steps[0] == 1024 and all(256 <= s < 1024 for s in steps[1:-1]) and 256 in steps, steps
    e.send(m.Stop(1))
    e.read_until(m.Done, ident=1)
    e.send(m.Gen(1, tuple(range(5000, 9096)), {}, 3))  # (not the prompt read before: its blocks are cached)
    rows = [x.done for x in e.read_until(m.Done, ident=3) if isinstance(x, m.PromptProgress) and x.id == 3]
    assert rows == [1024, 2048, 3072, 4096]  # alone: nobody waits on its steps
