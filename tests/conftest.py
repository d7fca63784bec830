import os
import shutil
import tempfile
from pathlib import Path

# `make test` runs the suite in parallel workers (pytest-xdist): one BLAS thread a process, else
# OpenBLAS's spinning threads starve the other processes on the cores (the 3-rank TP tests ran 10x
# slower); set before NumPy loads, inherited by every server, engine and worker
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
# and the BLAS kernels the engine asks for, so that the runners the tests build in this process compute
# rows as the engine processes do: the engine's own choice, whatever core the machine's environment names (the
# engine keeps a named one; a CI machine that named Haswell, whose rows depend on the step's shape, failed the
# CPU's exactness tests)
from engine.ops.blas_order import prefer_row_invariant_blas  # noqa: E402

os.environ.pop("OPENBLAS_CORETYPE", None)
prefer_row_invariant_blas()
# A folder of this run's (the controller's, inherited by the workers), removed at its end: the servers' logs
# (tests/harness.py), and the CPU engines' expanded weights, written by the run's first start of each model
# and read by every later one (engine/model/expanded_cache.py: the expansion was most of an engine's start,
# and the suite starts about 200)
RUN_DIR = None if "STRATA_TEST_RUN_DIR" in os.environ else tempfile.mkdtemp(prefix="strata-test-")


def remove_killed_runs_folders() -> None:
    """The folders of runs killed before their end (their owner process gone): the weights are large."""
    for folder in Path(tempfile.gettempdir()).glob("strata-test-*"):
        owner = folder / "owner"
        if folder.is_dir() and owner.exists() and not Path(f"/proc/{owner.read_text().strip()}").exists():
            shutil.rmtree(folder, ignore_errors=True)


if RUN_DIR:
    remove_killed_runs_folders()
    (Path(RUN_DIR) / "owner").write_text(str(os.getpid()))
    os.environ["STRATA_TEST_RUN_DIR"] = RUN_DIR
    os.environ.setdefault("STRATA_CPU_WEIGHT_CACHE", os.path.join(RUN_DIR, "weights"))

import pytest  # noqa: E402

from engine.modelfile.model_path import default_model_path  # noqa: E402
from tests.harness import PY, EngineProcess, ServerProcess, mark_test_run, mock_engine_cmd, sweep  # noqa: E402

pytest_plugins = ["tests.slowest_first"]


def pytest_unconfigure(config):
    if RUN_DIR:
        shutil.rmtree(RUN_DIR, ignore_errors=True)


def pytest_configure(config):
    # every process the suite starts inherits the run's id (see tests/harness.py); an xdist worker's
    # is its own, under the controller's, so that its sweep leaves the other workers' processes alone
    mark_test_run(getattr(config, "workerinput", {}).get("workerid"))


def pytest_addoption(parser):
    parser.addoption("--waiting-lane", action="store_true",
                     help="keep the last xdist worker for the modules that mostly wait (tests/worker_lanes.py)")


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") != "loadfile":
        return None
    from tests.worker_lanes import WorkerLanes, waiting_modules

    order = config.pluginmanager.get_plugin("slowest_first_order")
    return WorkerLanes(config, log, waiting_modules(order.before, order.cpu_before), config.getoption("waiting_lane"))


OUTLIVED: list[str] = []  # processes the session's finalizer had to end (the workers' too, on the controller)


@pytest.fixture(scope="session", autouse=True)
def no_process_outlives_the_run():
    """Tests end what they start; this session finalizer ends whatever a crashed fixture left."""
    yield
    OUTLIVED.extend(sweep())


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    """On the xdist controller: what a worker's sweep ended counts as the run's."""
    OUTLIVED.extend(getattr(node, "workeroutput", {}).get("outlived", []))


@pytest.hookimpl(trylast=True)  # after the fixtures' teardown
def pytest_sessionfinish(session, exitstatus):
    """A run that passed but left processes behind fails, naming them (an interrupted run's
    leftovers are only ended). An xdist worker hands its list to the controller, which reports."""
    if hasattr(session.config, "workeroutput"):
        session.config.workeroutput["outlived"] = list(OUTLIVED)
        return
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

    def start(*args: str, mock: bool = False, env: dict[str, str] | None = None) -> EngineProcess:
        module = "engine.mock_engine" if mock else "engine"
        engine = EngineProcess([PY, "-m", module, "--serve", *args], env)
        started.append(engine)
        return engine

    yield start
    for engine in started:
        engine.close()
