"""Shutdown is the server's: SIGINT (Ctrl+C) or SIGTERM to the server's whole process group, with
the real engine, idle or with a request running. No traceback, no engine restart, exit status 0,
the running request answered in full; and `strata` at a terminal stops quietly on Ctrl+C."""
import os
import signal
import subprocess
import time

import pytest

from tests.harness import PY, ROOT, ServerProcess
from tests.serve.helpers import Background, chat
from tests.serve.scheduling.test_scheduling import status, wait_for


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
@pytest.mark.parametrize("running", [False, True], ids=["idle", "running"])
def test_a_signal_to_the_process_group_stops_the_server_cleanly(sig, running):
    # a grace long enough for the running answer on a loaded machine: the grace's length is not what is tested
    server = ServerProcess(extra=["--device", "cpu", "--ctx", "1024", "--shutdown-grace-s", "60"]).start()
    try:
        engine = server.engine_pids()[0]
        assert os.getpgid(engine) != os.getpgid(server.proc.pid)  # the group's signal is not the engine's
        ask = dict(content="Count from one to twenty.", max_tokens=24, temperature=0)
        if running:
            whole = chat(server.url, **ask).json()["choices"][0]["message"]["content"]
            request = Background(chat, server.url, **ask)
            request.start()
            wait_for(lambda: status(server)["busy"])
        os.killpg(server.proc.pid, sig)  # what Ctrl+C in `make serve` or a supervisor does
        assert server.proc.wait(30) == 0
        if running:
            r = request.get()
            assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == whole
        wait_for(lambda: not os.path.exists(f"/proc/{engine}"))
    finally:
        server.stop()
    log = server.log()
    assert "Traceback" not in log and "KeyboardInterrupt" not in log, log
    assert "restarting" not in log and "exited unexpectedly" not in log and log.count("strata: loaded ") == 1


def default_sigint() -> None:
    """A shell without job control starts background commands with SIGINT ignored, and Python keeps
    an inherited ignore (as a nohup'd program should): the child gets SIGINT's default back, as at
    a terminal, so that the suite run in the background tests what a user's Ctrl+C does."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_strata_at_a_terminal_stops_quietly_on_ctrl_c():
    proc = subprocess.Popen([PY, "-m", "engine", "--device", "cpu", "--max-tokens", "400",
                             "Write a long story about a lighthouse keeper."], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                            preexec_fn=default_sigint)
    os.set_blocking(proc.stdout.fileno(), False)
    deadline, seen = time.monotonic() + 60, b""
    while len(seen.split()) < 3 and time.monotonic() < deadline:  # the answer has begun
        seen += proc.stdout.read() or b""
        time.sleep(0.05)
    assert len(seen.split()) >= 3, "the answer did not begin within 60 s"
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, (proc.returncode, len((seen + out).split()), err[-2000:])
    assert b"Traceback" not in err and b"KeyboardInterrupt" not in err, err
    assert len((seen + out).split()) < 300  # it stopped well before its 400 tokens
