"""List processes started from a checkout that are still alive; exit 1 if there are any.

`.ci/run` runs this after `make test`: a server or engine that outlives the suite fails CI. A
process counts as the checkout's when its working directory is inside it or its command line names
a path inside it (the venv's python, a tool script). This process and its ancestors (the shell
running CI) are not counted. Processes get --wait-s to finish exiting before they count.

    python3 tools/checks/leftover_processes.py [--root DIR] [--wait-s 10]
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path


def ancestors(pid: int) -> set[int]:
    seen = set()
    while pid > 1 and pid not in seen:
        seen.add(pid)
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            break
    return seen


def leftovers(root: Path) -> dict[int, str]:
    mine, prefix = ancestors(os.getpid()), str(root) + os.sep
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in mine:
            continue
        try:
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
            cwd = os.readlink(entry / "cwd")
        except OSError:  # gone meanwhile, or another user's
            continue
        if state == "Z" or not cmdline:
            continue
        if cwd == str(root) or cwd.startswith(prefix) or prefix in cmdline:
            found[int(entry.name)] = cmdline
    return found


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[2])
    p.add_argument("--wait-s", type=float, default=10.0, help="time left to processes still exiting")
    a = p.parse_args(argv)
    root = a.root.resolve()
    deadline = time.monotonic() + a.wait_s
    while (found := leftovers(root)) and time.monotonic() < deadline:
        time.sleep(0.5)
    if not found:
        print(f"no process started from {root} is left")
        return 0
    print(f"{len(found)} process(es) started from {root} outlived the run:", file=sys.stderr)
    for pid, cmdline in sorted(found.items()):
        print(f"  {pid}: {cmdline[:300]}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
