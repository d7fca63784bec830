"""Not collected by the suite (no test_ prefix): tests/test_process_hygiene.py runs it in a pytest of
its own and interrupts it half-way, as a user's Ctrl+C or a killed CI job would."""
import os
import time
from pathlib import Path

import pytest

from tests.harness import ServerProcess, mock_engine_cmd


@pytest.fixture(scope="module")
def module_server():
    with ServerProcess(engine_cmd=mock_engine_cmd()) as server:
        yield server


def test_half_way(module_server, server_factory):
    server_factory(engine_cmd=mock_engine_cmd())  # a second server, function-scoped
    Path(os.environ["STRATA_HALF_WAY"]).touch()  # both servers and their engines are up
    time.sleep(120)  # the interruption comes here
