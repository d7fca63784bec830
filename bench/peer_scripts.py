"""llama.cpp's own server test scripts (scripts/server-test-function-call.py, -parallel-tc.py and
-structured.py from its source tree) against a running server, Strata's or llama-server's, on the
same model: each script with a time limit, its per-case PASS / FAIL lines counted (a script cut by
the limit still reports the cases it finished). Writes a JSON summary, and each script's output
(the model's text and calls, case by case) beside it in OUT.logs/.

    python bench/peer_scripts.py --scripts DIR --port 8811 --label strata --out bench/results/peer_scripts_strata.json

Start the server first as a user would (Strata: `strata-server --model FILE`; llama.cpp:
`llama-server -m FILE --jinja`). ../shared/PEERS.md says where the scripts come from.
"""
from __future__ import annotations

import argparse
import json
import platform
import re
import subprocess
import sys
import time
from pathlib import Path

SCRIPTS = ("server-test-function-call.py", "server-test-parallel-tc.py", "server-test-structured.py")
MARK = re.compile(r"(✔ PASS|✘ FAIL)\s*(.*)")
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def run(script: Path, port: int, limit_s: float, log: Path) -> dict:
    """One script against the server; its whole output (what the model wrote, call by call) goes to
    `log`, so that each failure can be traced to the model's text."""
    start = time.monotonic()
    try:
        done = subprocess.run([sys.executable, str(script), "--port", str(port)], capture_output=True, text=True,
                              timeout=limit_s)
        out, finished = done.stdout, True
    except subprocess.TimeoutExpired as e:
        out, finished = (e.stdout.decode() if isinstance(e.stdout, bytes) else e.stdout) or "", False
    out = ANSI.sub("", out)
    log.write_text(out)
    lines = [MARK.search(line) for line in out.splitlines()]
    results = [(m.group(1).endswith("PASS"), m.group(2).strip()) for m in lines if m]
    return {"script": script.name, "passed": sum(ok for ok, _ in results), "finished_cases": len(results),
            "completed": finished, "seconds": round(time.monotonic() - start, 1),
            "failures": [why for ok, why in results if not ok]}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scripts", type=Path, required=True, help="llama.cpp's scripts/ folder")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--label", required=True)
    p.add_argument("--limit-s", type=float, default=900.0, help="time limit per script")
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args()
    summary = {"server": a.label, "machine": f"{platform.node()} ({platform.processor() or platform.machine()}, "
                                             f"{__import__('os').cpu_count()} cores)", "runs": []}
    logs = a.out.with_suffix(".logs")
    logs.mkdir(exist_ok=True)
    for name in SCRIPTS:
        result = run(a.scripts / name, a.port, a.limit_s, logs / name.replace(".py", ".txt"))
        print(json.dumps(result), flush=True)
        summary["runs"].append(result)
        a.out.write_text(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
