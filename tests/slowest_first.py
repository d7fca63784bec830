"""Test modules slowest first, by their seconds in the runs before (kept in pytest's cache): `make
test`'s parallel workers (pytest-xdist, a module to a worker, --no-loadscope-reorder) then start the
long modules at once and end together, instead of one worker reading a long module alone at the end.
A first run (a clean clone: nothing cached) orders by tests/module_seconds.json, a full run's figures
kept in the repository; `python -m tests.slowest_first` writes it again from the cache of a run.

Each module's CPU seconds are kept beside its wall seconds: what its tests and every process under
them (servers, engines, a session's server started earlier) spent on the cores meanwhile. A module
that mostly waits (timers of the mock engine, a server's answer to a client that sleeps) can run on a
worker of its own beside the busy ones (tests/worker_lanes.py)."""
import json
import os
import sys
from pathlib import Path

import pytest

KEY, CPU_KEY = "strata/module_seconds", "strata/module_cpu_seconds"
KEPT = Path(__file__).with_name("module_seconds.json")


def module_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def cpu_seconds() -> float:
    """The CPU time of this process and every process under it: the live ones (a session's server
    started by an earlier module and still serving) read from /proc, each with the children it waited
    for; the ended ones this process waited for in its own children's time."""
    t = os.times()
    own = t.user + t.system + t.children_user + t.children_system
    try:
        return own + descendants_ticks(os.getpid()) / os.sysconf("SC_CLK_TCK")
    except OSError:  # no /proc: the waited-for ones only
        return own


def descendants_ticks(root: int) -> int:
    """utime + stime + cutime + cstime of every live process under `root`, in clock ticks."""
    parent, ticks = {}, {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:  # ended meanwhile
            continue
        fields = stat[stat.rindex(")") + 2:].split()  # from the state (field 3) on
        parent[int(entry)], ticks[int(entry)] = int(fields[1]), sum(map(int, fields[11:15]))
    children: dict[int, list[int]] = {}
    for pid, ppid in parent.items():
        children.setdefault(ppid, []).append(pid)
    total, todo = 0, list(children.get(root, []))
    while todo:
        pid = todo.pop()
        total += ticks[pid]
        todo += children.get(pid, [])
    return total


class SlowestFirst:
    def __init__(self, config: pytest.Config):
        self.config = config
        self.spent: dict[str, float] = {}  # this run's seconds by module (setup, call and teardown)
        self.cpu: dict[str, float] = {}  # this run's CPU seconds by module
        self.started: dict[str, float] = {}  # on a worker: each running test's CPU clock at its setup
        workerinput = getattr(config, "workerinput", None)
        # xdist's workers must collect alike: they sort by what the controller read, once
        self.before, self.cpu_before = (workerinput.get(KEY, {}), {}) if workerinput is not None else self.cached()

    def cached(self) -> tuple[dict[str, float], dict[str, float]]:
        """The wall and CPU seconds of the runs before: the cache's, over those kept in the repository."""
        cache = getattr(self.config, "cache", None)
        wall, cpu = kept()
        return wall | (cache.get(KEY, {}) if cache else {}), cpu | (cache.get(CPU_KEY, {}) if cache else {})

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node) -> None:
        node.workerinput[KEY] = self.before

    @pytest.hookimpl(trylast=True)  # after pytest's own ordering by fixtures: a stable sort keeps it within a module
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        items.sort(key=lambda item: -self.before.get(module_of(item.nodeid), 0.0))

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call):
        """The test's CPU seconds (setup to teardown) ride on its teardown report to the controller."""
        if call.when == "setup":
            self.started[item.nodeid] = cpu_seconds()
        outcome = yield
        if call.when == "teardown" and item.nodeid in self.started:
            outcome.get_result().user_properties.append(("cpu_s", cpu_seconds() - self.started.pop(item.nodeid)))

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        module = module_of(report.nodeid)
        self.spent[module] = self.spent.get(module, 0.0) + report.duration
        for name, value in report.user_properties:
            if name == "cpu_s":
                self.cpu[module] = self.cpu.get(module, 0.0) + value

    def pytest_sessionfinish(self) -> None:
        cache = getattr(self.config, "cache", None)
        if cache and not hasattr(self.config, "workerinput"):  # under xdist the controller has every report
            wall, cpu = self.cached()
            cache.set(KEY, wall | self.spent)
            cache.set(CPU_KEY, cpu | self.cpu)


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(SlowestFirst(config), "slowest_first_order")


def kept() -> tuple[dict[str, float], dict[str, float]]:
    """The repository's wall and CPU seconds by module."""
    if not KEPT.exists():
        return {}, {}
    data = json.loads(KEPT.read_text())
    return data.get("wall", {}), data.get("cpu", {})


def main() -> int:
    """tests/module_seconds.json from pytest's cache (.pytest_cache), for the modules that still exist."""
    figures = {}
    for name, key in (("wall", KEY), ("cpu", CPU_KEY)):
        cached = json.loads((Path(".pytest_cache/v") / key).read_text())
        figures[name] = dict(sorted(((m, round(s, 1)) for m, s in cached.items() if Path(m).exists()),
                                    key=lambda kv: -kv[1]))
    KEPT.write_text(json.dumps(figures, indent=1) + "\n")
    print(f"{KEPT}: {len(figures['wall'])} modules, {sum(figures['wall'].values()):.0f} s, "
          f"{sum(figures['cpu'].values()):.0f} CPU seconds", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
