import pytest

from engine.modelfile.model_path import default_model_path
from tests.harness import PY, EngineProcess, ServerProcess, mark_test_run, mock_engine_cmd, sweep


def pytest_configure(config):
    mark_test_run()  # every process the suite starts inherits the run's id (see tests/harness.py)


OUTLIVED: list[str] = []  # processes the session's finalizer had to end


@pytest.fixture(scope="session", autouse=True)
def no_process_outlives_the_run():
    """Tests end what they start; this session finalizer ends whatever a crashed fixture left."""
    yield
    OUTLIVED.extend(sweep())


@pytest.hookimpl(trylast=True)  # after the fixtures' teardown
def pytest_sessionfinish(session, exitstatus):
    """A run that passed but left processes behind fails, naming them (an interrupted run's
    leftovers are only ended)."""
    if OUTLIVED and exitstatus == pytest.ExitCode.OK:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter:
            reporter.write("\n")
        for line in [f"{len(OUTLIVED)} process(es) outlived their tests (ended by the session's sweep):", *OUTLIVED]:
            reporter.write_line(line, red=True) if reporter else print(line)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture(scope="session")
def model_path() -> str:
    return str(default_model_path())


@pytest.fixture(scope="session")
def tokenizer(model_path):
    from engine.modelfile.tokenizer import load_tokenizer

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
        module = "engine.loop.mock_engine" if mock else "engine"
        engine = EngineProcess([PY, "-m", module, "--serve", *args])
        started.append(engine)
        return engine

    yield start
    for engine in started:
        engine.close()
