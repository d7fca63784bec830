"""After an engine death (serve/scheduling/recovery.py): what it held runs again, and a request blamed for
max_retries deaths in a row is taken for their cause and fails; a death the engine explained (it ran out of memory,
and is started again taking fewer requests) blames nobody."""
from protocol import messages as m
from serve.scheduling.metrics import Metrics
from serve.scheduling.request import EngineFailure, Request
from serve.scheduling.scheduler import Scheduler
from tests.serve.scheduling.test_scheduler_machine import MAX_RETRIES, RecordingEngine


def deaths(blame: bool) -> Request:
    """A read in front of the engine at MAX_RETRIES deaths in a row, each blamed or not; the read."""
    scheduler = Scheduler(Metrics(), preempt=True, max_wait_s=5.0, max_retries=MAX_RETRIES, eos_ids=frozenset({2}))
    scheduler.engine = engine = RecordingEngine()
    a = Request(list(range(1000, 1900)), 4, {"temperature": 0.0})
    scheduler.submit(a)
    for _ in range(MAX_RETRIES):
        assert isinstance(engine.sent[-1], m.Gen) and engine.sent[-1].id == a.id
        scheduler.on_message(m.PromptProgress(256, 900, 10.0, 25600.0, a.id))  # its chunk in the engine
        scheduler.on_engine_exit("the engine process exited unexpectedly (exit code 3)", blame)
        scheduler.on_engine_ready()
    return a


def failures(req: Request) -> list[EngineFailure]:
    events = [req.events.get_nowait() for _ in range(req.events.qsize())]
    return [e for e in events if isinstance(e, EngineFailure)]


def test_a_read_in_front_at_every_death_is_taken_for_their_cause():
    a = deaths(blame=True)
    assert a.deaths_running == MAX_RETRIES and "taken for their cause" in failures(a)[0].message


def test_deaths_the_engine_explained_blame_nobody():
    a = deaths(blame=False)
    assert a.deaths_running == 0 and not failures(a) and a.restarts == MAX_RETRIES
