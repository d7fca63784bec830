"""Long prompt reads through HTTP, Strata beside llama.cpp's server on the same file: each server is
started as its user starts it (the command given, nothing tuned), then sent one request of each
--tokens size (random token ids to /v1/completions, max_tokens 1, a fresh prompt each time so that
no prefix cache helps), --repeats times; the median wall time per size, send to response, and the
read rate it implies. Servers run one at a time, each stopped (with its engine) before the next.

    python bench/long_read_http.py --server "strata=python3 -m serve --model F --port 8080" \\
        --server "llama.cpp=llama-server -m F -ngl 99 -fa on -c 132000 --port 8080" \\
        [--tokens 97000,130000] [--repeats 2] [--json OUT]
"""
from __future__ import annotations

import argparse
import json
import random
import shlex
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.chunk_default_bench import Server, machine, read  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--server", action="append", required=True, metavar="NAME=COMMAND",
                   help="a label and the command that starts the server (it must name --port)")
    p.add_argument("--tokens", default="97000,130000")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--token-range", default="1000,30000", help="the random ids' range LOW,HIGH")
    p.add_argument("--start-limit-s", type=float, default=300)
    p.add_argument("--json")
    a = p.parse_args()
    low, high = (int(x) for x in a.token_range.split(","))
    rng = random.Random(7)
    report = {"machine": machine(), "repeats": a.repeats, "servers": {}}
    for spec in a.server:
        name, cmd = spec.split("=", 1)
        entry = report["servers"][name] = {"command": cmd}
        try:
            with Server(shlex.split(cmd), Path(f"/tmp/long_read_{name}.log"), a.start_limit_s) as server:
                entry["ready_s"] = round(server.start_s, 2)
                read(server.url, [rng.randint(low, high) for _ in range(512)], {})  # warm-up
                for n in (int(x) for x in a.tokens.split(",")):
                    runs = []
                    for _ in range(a.repeats):
                        out: dict = {}
                        read(server.url, [rng.randint(low, high) for _ in range(n)], out)
                        if out.get("error") or out.get("status") != 200:
                            raise RuntimeError(f"{name}, {n} tokens: {out.get('error') or out.get('status')}")
                        runs.append(out["done"] - out["sent"])
                    wall = statistics.median(runs)
                    entry[str(n)] = {"wall_s": [round(r, 2) for r in runs], "median_s": round(wall, 2),
                                     "tok_s": round(n / wall)}
                    print(f"{name}: {n} tokens in {wall:.2f} s ({n / wall:.0f} tok/s; runs {runs})", flush=True)
        except RuntimeError as e:
            entry["error"] = str(e)[:2000]
            print(f"{name}: {e}", flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(report, indent=1) + "\n")
    return 0 if all("error" not in e for e in report["servers"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
