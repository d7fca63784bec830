import pytest

from engine.model_path import default_model_path
from tests.harness import PY, EngineProcess, ServerProcess, mock_engine_cmd


@pytest.fixture(scope="session")
def model_path() -> str:
    return str(default_model_path())


@pytest.fixture(scope="session")
def tokenizer(model_path):
    from engine.tokenizer import load_tokenizer

    return load_tokenizer(model_path)


@pytest.fixture
def server_factory():
    """Start servers with given options; every one is stopped at teardown."""
    started = []

    def start(*, wait_ready: bool = True, **kwargs) -> ServerProcess:
        server = ServerProcess(**kwargs)
        started.append(server)
        return server.start(wait_ready=wait_ready)

    yield start
    for server in started:
        server.stop()


@pytest.fixture(scope="module")
def mock_server():
    """One server over the mock engine (echo), shared by a module's read-only tests."""
    with ServerProcess(engine_cmd=mock_engine_cmd("--chunk-s", "0.005", "--token-s", "0.002")) as server:
        yield server


@pytest.fixture
def engine_factory():
    started = []

    def start(*args: str, mock: bool = False) -> EngineProcess:
        module = "protocol.mock_engine" if mock else "engine"
        engine = EngineProcess([PY, "-m", module, "--serve", *args])
        started.append(engine)
        return engine

    yield start
    for engine in started:
        engine.close()
