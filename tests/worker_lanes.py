"""How `make test` hands modules to its xdist workers: a module to a worker (--dist loadfile), modules
sharing a session's server on one worker, and, with --waiting-lane, one worker kept for the modules
that mostly wait.

A module over the mock engine spends most of its time waiting on timers (tokens every few ms, parks,
deaths staged a second apart) and little on the cores; beside a worker a core, each such module held a
core's worker for a minute while the real-engine modules queued behind it. With --waiting-lane the last
worker takes only the modules whose CPU seconds were under WAITING_SHARE of their wall seconds in the
runs before (tests/slowest_first.py keeps both), and the others take the busy modules first, slowest
first, then whatever is left. The Makefile starts a worker a core plus this one.
"""
from __future__ import annotations

from xdist.scheduler import LoadFileScheduling

# modules that share a session's server (tests/serve/conftest.py) run on one worker: under --dist
# loadfile each would otherwise start its own (for qwen_server, a 0.5B model's 15 s and 3 GiB each)
SHARED_WORKER = {"tests/serve/http/test_text_api.py": "tests/serve/api/test_real_model_tool_calls.py",
                 "tests/serve/http/test_choices.py": "tests/serve/api/test_logprobs.py"}  # (default_server)
WAITING_SHARE = 0.45  # CPU seconds per wall second under which a module counts as waiting (a busy module
# measured beside two others on two cores shows about 0.67)


def waiting_modules(wall: dict[str, float], cpu: dict[str, float]) -> set[str]:
    """The modules whose last known CPU seconds were under WAITING_SHARE of their wall seconds."""
    return {m for m, s in wall.items() if m in cpu and s > 0 and cpu[m] < WAITING_SHARE * s}


class WorkerLanes(LoadFileScheduling):
    def __init__(self, config, log, waiting: set[str], lane: bool):
        super().__init__(config, log)
        self.waiting, self.lane_wanted = waiting, lane
        self.lane = None  # the worker kept for waiting modules, chosen once when the work is first handed out

    def _split_scope(self, nodeid: str) -> str:
        module = nodeid.split("::", 1)[0]
        return SHARED_WORKER.get(module, module)

    def schedule(self) -> None:
        """The lane: the last worker, when asked for and there are two or more (fixed now: the list of
        workers shrinks as they finish)."""
        if self.collection is None and self.lane_wanted and len(self.nodes) >= 2:
            self.lane = self.nodes[-1]
        super().schedule()

    def _assign_work_unit(self, node) -> None:
        """xdist's hand-out of the queue's first module, that module chosen first: for the lane the first
        waiting one (none left: its part is done), for the others the first busy one, else the first."""
        scopes = list(self.workqueue)
        if not scopes:
            return
        if node is self.lane:
            scope = next((s for s in scopes if s in self.waiting), None)
            if scope is None:
                node.shutdown()
                return
        else:
            scope = next((s for s in scopes if s not in self.waiting), scopes[0])
        self.workqueue.move_to_end(scope, last=False)
        super()._assign_work_unit(node)
        lane = self.lane
        if lane is not None and not lane.shutting_down and not any(s in self.waiting for s in self.workqueue) \
                and not self._pending_of(self.assigned_work.get(lane, {})):
            lane.shutdown()  # idle, and nothing left it could take
