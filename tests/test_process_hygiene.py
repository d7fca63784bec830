"""Tests end what they start, however the run ends: a pytest interrupted with Ctrl+C or killed
outright half-way leaves no server or engine behind."""
import os
import signal
import subprocess
import time

import pytest

from tests.harness import PY, ROOT, TEST_RUN_ENV, processes_of_this_run


def run_processes(run_id: str) -> list[int]:
    saved = os.environ[TEST_RUN_ENV]
    os.environ[TEST_RUN_ENV] = run_id
    try:
        return processes_of_this_run()
    finally:
        os.environ[TEST_RUN_ENV] = saved


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL], ids=["ctrl-c", "killed"])
def test_an_interrupted_run_leaves_no_process(tmp_path, sig):
    run_id = f"inner-{os.getpid()}-{time.time_ns()}"
    marker = tmp_path / "half-way"
    env = {**os.environ, TEST_RUN_ENV: run_id, "STRATA_HALF_WAY": str(marker)}
    # a terminal's Ctrl+C goes to the foreground group: pytest (its own group here), SIGINT's default restored
    inner = subprocess.Popen([PY, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/hygiene/interrupted_run.py"],
                             cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             start_new_session=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 120
        while not marker.exists() and inner.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert marker.exists(), inner.communicate(timeout=30)[0].decode()[-3000:]
        started = run_processes(run_id)
        assert len(started) >= 5  # pytest itself, its two servers and their engines
        os.killpg(inner.pid, sig)
        out = inner.communicate(timeout=60)[0].decode()
        deadline = time.monotonic() + 30
        while (left := run_processes(run_id)) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not left, f"left behind after {sig.name}: {left}\n{out[-3000:]}"
    finally:
        if inner.poll() is None:
            os.killpg(inner.pid, signal.SIGKILL)
            inner.wait()
