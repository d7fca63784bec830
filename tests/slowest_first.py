"""Test modules slowest first, by their seconds in the runs before (kept in pytest's cache): `make
test`'s parallel workers (pytest-xdist, a module to a worker, --no-loadscope-reorder) then start the
long modules at once and end together, instead of one worker reading a long module alone at the end.
A first run (a clean clone: nothing cached) orders by tests/module_seconds.json, a full run's seconds
kept in the repository; `python -m tests.slowest_first` writes it again from the cache of a run."""
import json
import sys
from pathlib import Path

import pytest

KEY = "strata/module_seconds"
KEPT = Path(__file__).with_name("module_seconds.json")


def module_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


class SlowestFirst:
    def __init__(self, config: pytest.Config):
        self.config = config
        self.spent: dict[str, float] = {}  # this run's seconds by module (setup, call and teardown)
        workerinput = getattr(config, "workerinput", None)
        # xdist's workers must collect alike: they sort by what the controller read, once
        self.before = workerinput.get(KEY, {}) if workerinput is not None else self.cached()

    def cached(self) -> dict[str, float]:
        """The seconds of the runs before: the cache's, over those kept in the repository."""
        cache = getattr(self.config, "cache", None)
        return kept() | (cache.get(KEY, {}) if cache else {})

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node) -> None:
        node.workerinput[KEY] = self.before

    @pytest.hookimpl(trylast=True)  # after pytest's own ordering by fixtures: a stable sort keeps it within a module
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        items.sort(key=lambda item: -self.before.get(module_of(item.nodeid), 0.0))

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        module = module_of(report.nodeid)
        self.spent[module] = self.spent.get(module, 0.0) + report.duration

    def pytest_sessionfinish(self) -> None:
        cache = getattr(self.config, "cache", None)
        if cache and not hasattr(self.config, "workerinput"):  # under xdist the controller has every report
            cache.set(KEY, self.cached() | self.spent)


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(SlowestFirst(config), "slowest_first_order")


def kept() -> dict[str, float]:
    return json.loads(KEPT.read_text()) if KEPT.exists() else {}


def main() -> int:
    """tests/module_seconds.json from pytest's cache (.pytest_cache), for the modules that still exist."""
    cache = Path(".pytest_cache/v") / KEY
    seconds = {m: round(s, 1) for m, s in json.loads(cache.read_text()).items() if Path(m).exists()}
    KEPT.write_text(json.dumps(dict(sorted(seconds.items(), key=lambda kv: -kv[1])), indent=1) + "\n")
    print(f"{KEPT}: {len(seconds)} modules, {sum(seconds.values()):.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
