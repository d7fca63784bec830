"""The step trace ($STRATA_STEP_TRACE): one JSON line a step on stderr when on, nothing when off."""
import json
import time

from engine.loop.step_trace import StepTrace


def test_a_step_is_one_line_when_on_and_none_when_off(capsys):
    StepTrace(enabled=False).step("prompt", time.perf_counter(), rows=3)
    assert capsys.readouterr().err == ""
    StepTrace(enabled=True).step("prompt", time.perf_counter(), rows=3, reads=[[1, 0, 3]])
    prefix, line = capsys.readouterr().err.strip().split(" ", 1)
    fields = json.loads(line)
    assert prefix == "strata-trace" and fields["kind"] == "prompt" and fields["rows"] == 3 and fields["ms"] >= 0


def test_an_event_is_a_line_at_its_moment(capsys):
    trace = StepTrace(enabled=True)
    trace.event("gen", id=7, tokens=12)
    fields = json.loads(capsys.readouterr().err.strip().split(" ", 1)[1])
    assert fields["kind"] == "gen" and fields["id"] == 7 and fields["tokens"] == 12 and fields["ms"] < 5
    StepTrace(enabled=False).event("gen", id=7)
    assert capsys.readouterr().err == ""


def test_trace_waits_reads_each_requests_wait_from_a_log(tmp_path):
    """tools/profiling/trace_waits.py over lines as StepTrace writes them: a request's first token is the end of
    the step that read its prompt's last row; an idle stretch while it waits is reported."""
    from tools.profiling import trace_waits

    log = tmp_path / "server.log"
    lines = [{"t": 1.0, "ms": 0.0, "kind": "gen", "id": 5, "tokens": 300},
             {"t": 1.01, "ms": 40.0, "kind": "prompt", "rows": 256, "reads": [[5, 0, 256]], "paused_ms": 0.0},
             {"t": 1.05, "ms": 10.0, "kind": "decode", "rows": 4},
             {"t": 1.2, "ms": 20.0, "kind": "prompt", "rows": 44, "reads": [[5, 256, 300]], "paused_ms": 0.0}]
    log.write_text("INFO: other lines\n" + "".join(f"strata-trace {json.dumps(e)}\n" for e in lines))
    events = list(trace_waits.lines(str(log)))
    (wait,) = trace_waits.waits(events, 0, 10)
    assert wait["id"] == 5 and round((wait["first"] - wait["gen"]) * 1000) == 220 and wait["steps"] == 2
    assert [round(ms) for _, ms in trace_waits.idle_gaps(events, 20)] == [140]


def test_trace_waits_counts_a_stall_that_began_before_the_first_gen(tmp_path, capsys):
    """A step ends, the engine runs none for 500 ms, and the GENs of a burst are taken during that stall: the stall is
    an idle gap of the burst's window (the step before its first GEN included), and the waits are counted from the
    first GEN too."""
    from tools.profiling import trace_waits

    log = tmp_path / "server.log"
    lines = [{"t": 0.9, "ms": 100.0, "kind": "prompt", "rows": 64, "reads": [[1, 0, 64]], "paused_ms": 0.0},
             {"t": 1.001, "ms": 0.0, "kind": "gen", "id": 5, "tokens": 10},
             {"t": 1.3, "ms": 0.0, "kind": "gen", "id": 6, "tokens": 10},
             {"t": 1.5, "ms": 20.0, "kind": "prompt", "rows": 20, "reads": [[5, 0, 10], [6, 0, 10]], "paused_ms": 0.0}]
    log.write_text("".join(f"strata-trace {json.dumps(e)}\n" for e in lines))
    assert trace_waits.main([str(log), "--from", "5"]) == 0
    out = capsys.readouterr().out
    assert "idle   500.0 ms from     1.000" in out
    assert "engine wait p50 369.5 ms, max 519.0 ms; from the first GEN p50 519.0 ms, max 519.0 ms" in out


def test_the_loop_traces_each_decode_steps_draws_before_it(small_q4_1, capsys):
    """The engine's loop in this process (tests/engine/loop/hybrid_runner.py small_runner): each decode step's line
    comes after a draws line (the host's work before it), both for the requests decoding."""
    from engine.loop.loop import EngineLoop
    from engine.loop.park_policy import ParkPolicy
    from protocol import messages as m
    from tests.engine.loop.hybrid_runner import serve_until_idle, small_runner

    out: list = []
    loop = EngineLoop(small_runner(small_q4_1, blocks=16), ParkPolicy(), out.append)
    loop.rounds.trace.enabled = True
    capsys.readouterr()
    greedy = {"temperature": 0.0, "seed": 0}
    serve_until_idle(loop, [m.Gen(5, (300, 301, 302), greedy, 1), m.Gen(5, (400, 401), greedy, 2)], [], out)
    kinds = [json.loads(line.split(" ", 1)[1]) for line in capsys.readouterr().err.splitlines()
             if line.startswith("strata-trace ")]
    steps = [(e["kind"], e["rows"]) for e in kinds if e["kind"] in ("draws", "decode")]
    assert steps[:2] == [("draws", 2), ("decode", 2)] and len(steps) >= 8
    assert all(kind == "draws" for kind, _ in steps[0::2]) and all(kind == "decode" for kind, _ in steps[1::2])
    draws = [e for e in kinds if e["kind"] == "draws"]
    assert all(0 <= e["picks_ms"] and 0 <= e["lines_ms"] and e["picks_ms"] + e["lines_ms"] <= e["ms"] + 0.02
               for e in draws)  # (its parts: the draws at once, each row's token and line; the rest the blocks)


def test_trace_waits_sums_the_engines_time_by_kind_of_step_in_a_window():
    from tools.profiling import trace_waits

    events = [{"t": 0.9, "ms": 200.0, "kind": "prompt"}, {"t": 1.1, "ms": 0.0, "kind": "gen", "id": 1},
              {"t": 1.105, "ms": 5.0, "kind": "draws"}, {"t": 1.11, "ms": 20.0, "kind": "decode"},
              {"t": 1.2, "ms": 100.0, "kind": "decode"}]
    spent = trace_waits.time_by_kind(events, 1.0, 1.25)  # the first prompt and the last decode clipped to it
    assert {k: round(v, 3) for k, v in spent.items()} == {"prompt": 100.0, "draws": 5.0, "decode": 70.0,
                                                          "untraced": 75.0, "total": 250.0}


def test_trace_waits_takes_the_medians_of_one_batch_sizes_steps_and_their_period():
    from tools.profiling import trace_waits

    events = [{"t": 1.0, "ms": 2.0, "kind": "draws", "rows": 4, "picks_ms": 1.0, "lines_ms": 0.5},
              {"t": 1.002, "ms": 10.0, "kind": "decode", "rows": 4},
              {"t": 1.014, "ms": 3.0, "kind": "draws", "rows": 4, "picks_ms": 2.0, "lines_ms": 0.7},
              {"t": 1.017, "ms": 12.0, "kind": "decode", "rows": 4},
              {"t": 1.03, "ms": 40.0, "kind": "decode", "rows": 8},  # another batch size: not counted
              {"t": 1.031, "ms": 4.0, "kind": "draws", "rows": 4, "picks_ms": 3.0, "lines_ms": 0.6},
              {"t": 1.035, "ms": 14.0, "kind": "decode", "rows": 4}]
    got = trace_waits.step_medians(events, 4)
    assert got["draws"] == {"lines_ms": 0.6, "ms": 3.0, "picks_ms": 2.0, "count": 3}
    assert got["decode"]["ms"] == 12.0 and got["decode"]["count"] == 3
    assert round(got["decode"]["period_ms"], 3) == 16.5  # (15 and 18 ms between the 4-row steps' starts)
