"""What the per-model device checks share: each job's row printed as it ends, a job that raises a row of its own (the
others still run), the rows written to --json, and one line that says whether every one passed."""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Callable, Iterable


def report(jobs: Iterable[tuple[dict, Callable[[], dict]]], name: str, json_path: str | None) -> int:
    """jobs: (what names the job, the job: -> its row, with "ok"). Exit status 0 when every row is ok."""
    rows = []
    for ident, job in jobs:
        started = time.perf_counter()
        try:
            row = job()
        except Exception as e:  # a failure is a result: the other jobs still run
            row = ident | {"ok": False, "error": f"{type(e).__name__}: {e}"}
        row["seconds"] = round(time.perf_counter() - started, 1)
        print(json.dumps(row), flush=True)
        rows.append(row)
    if json_path:
        Path(json_path).write_text(json.dumps(rows, indent=1))
    ok = all(row["ok"] for row in rows)
    print(name, "PASSED" if ok else "FAILED")
    return 0 if ok else 1
