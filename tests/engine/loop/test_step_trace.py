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
