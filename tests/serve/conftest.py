"""Fixtures shared by the server's test modules."""
from __future__ import annotations

import pytest

import openai

from tests.harness import NO_WEIGHT_CACHE, ServerProcess
from tools.fixtures.fetch_fixture import fixture_path


@pytest.fixture(scope="session")
def qwen_server():
    """strata-server over the real engine on Qwen2.5-Coder-0.5B-Instruct (Q4_K_M, `make fixture` fetches
    and checks it) on the CPU: a real trained model with a real vocabulary (tool calls, fill-in-the-middle),
    started once a session (under xdist, once a worker that runs such a module) for the modules using it."""
    model = fixture_path()
    assert model.is_file(), f"{model} is missing: `make fixture` fetches it (`make test` does so first)"
    # the CPU's default chunk (256): the tools' prompt, the same in most requests, is reused from one to
    # the next to the 64-token block whatever the chunk (it took chunks of 64 when reuse kept whole chunks;
    # a 510-token read then took 8.3 s against 6.2)
    with ServerProcess(extra=["--model", str(model), "--device", "cpu"], env=NO_WEIGHT_CACHE).start(timeout_s=300) as s:
        yield s


@pytest.fixture(scope="session")
def default_server():
    """strata-server over the real engine on the default model (CPU, a 1,024-token context), started once
    a session (a worker) for the modules that only ask it questions."""
    with ServerProcess(extra=["--device", "cpu", "--ctx", "1024"]) as s:
        yield s


@pytest.fixture(scope="session")
def default_client(default_server):
    return openai.OpenAI(base_url=default_server.url + "/v1", api_key="unused", max_retries=0, timeout=120)
