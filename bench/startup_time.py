"""How long the server takes to be ready, started as a user starts it: `python -m serve --model FILE`
(plus --server-args) until /health answers 200, --repeats times (the first start may compile the
GPU kernels; later ones read CuPy's kernel cache and the page cache, as a user's next start does).
Each start's engine load line (its stages: weights, tokenizer, pool, warm-up) is kept beside it.

    python bench/startup_time.py --model FILE [--repeats 3] [--server-args "--kv-type q8_0"] [--json OUT]
"""
from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.chunk_default_bench import Server  # noqa: E402
from bench.engine_bench import machine  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--port", type=int, default=8080)
    p.add_argument("--server-args", default="")
    p.add_argument("--device", default="gpu", help="named in the report's machine line")
    p.add_argument("--json")
    a = p.parse_args()
    cmd = [sys.executable, "-m", "serve", "--model", a.model, "--port", str(a.port), *shlex.split(a.server_args)]
    report = {"machine": machine(a.device), "command": shlex.join(cmd[1:]), "starts": []}
    for i in range(a.repeats):
        log = Path(f"/tmp/startup_time_{i}.log")
        with Server(cmd, log, start_limit_s=300) as server:
            start_s = round(server.start_s, 2)
        loaded = [line for line in log.read_text(errors="replace").splitlines() if "strata: loaded" in line]
        report["starts"].append({"ready_s": start_s, "engine": loaded[-1] if loaded else None})
        print(f"start {i + 1}: ready after {start_s} s; {loaded[-1] if loaded else 'no load line'}", flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
