"""Where a process's main thread spent its time, from py-spy's folded stacks (`py-spy record --format raw`, one
line a distinct stack: `frame;frame;...;frame COUNT`, outermost first).

    python tools/profiling/spy_summary.py spy_strata.txt [--within DecodeSteps.step] [--top 25]

Prints, for the samples whose stack passes through --within (all samples without it): each function's share
inclusive (on the stack) and by itself (the innermost frame), largest first. A frame is `name (file:line)`; lines
are dropped so that one function's lines count together."""
from __future__ import annotations

import argparse
import collections
import re

FRAME = re.compile(r"^(?P<name>.*?) \((?P<file>[^:()]+)(?::\d+)?\)$")


def function(frame: str) -> str:
    """`Rounds.round (engine/loop/rounds.py:64)` -> `Rounds.round (engine/loop/rounds.py)`."""
    m = FRAME.match(frame.strip())
    return f"{m['name']} ({m['file']})" if m else frame.strip()


def read(path: str) -> list[tuple[list[str], int]]:
    """-> (stack outermost first, samples) a line."""
    stacks = []
    for line in open(path, encoding="utf-8", errors="replace"):
        stack, _, count = line.rstrip("\n").rpartition(" ")
        if stack and count.isdigit():
            stacks.append(([function(f) for f in stack.split(";")], int(count)))
    return stacks


def summary(stacks: list[tuple[list[str], int]], within: str | None) -> tuple[int, collections.Counter,
                                                                             collections.Counter]:
    """-> (samples counted, inclusive samples a function, self samples a function) over the stacks through
    `within` (a substring of a frame), counting only the frames below it."""
    total, inclusive, alone = 0, collections.Counter(), collections.Counter()
    for stack, count in stacks:
        if within is not None:
            at = next((i for i, f in enumerate(stack) if within in f), None)
            if at is None:
                continue
            stack = stack[at:]
        total += count
        for f in set(stack):
            inclusive[f] += count
        alone[stack[-1]] += count
    return total, inclusive, alone


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("path")
    ap.add_argument("--within", help="only samples whose stack holds a frame containing this")
    ap.add_argument("--top", type=int, default=25)
    a = ap.parse_args()
    total, inclusive, alone = summary(read(a.path), a.within)
    if not total:
        print("no samples" + (f" through {a.within}" if a.within else ""))
        return
    print(f"{total} samples" + (f" through {a.within}" if a.within else ""))
    for title, counts in (("inclusive", inclusive), ("self", alone)):
        print(f"--- {title}")
        for f, n in counts.most_common(a.top):
            print(f"{100 * n / total:6.1f}%  {f}")


if __name__ == "__main__":
    main()
