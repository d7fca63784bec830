"""The engine loop's own cost a decode step, apart from any model: the host's work between two forwards (the draws'
bookkeeping, each row's token line, its blocks, the step's plan), which on a GPU sits between two decode steps
(the step trace's `draws` line). The mock engine (engine/mock_engine.py) runs the real loop with no compute and its
tokens drawn ahead as a GPU's batched draws are (`--picked`): the engine's wall time a step is the loop's alone.

    python bench/loop_cost_bench.py [--rows 1,16,64] [--steps 2000] [--prompt 500] [--repeats 3]
        [--label NAME --json FILE]

For each --rows: that many requests at once over the line protocol (GEN, then reading every T and DONE), each a
--prompt-token prompt and --steps tokens; ms a decode step (the run's wall time over its steps) and us a row, and the
engine process's CPU seconds. The client reads the lines in this process, on the same machine (run it idle)."""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from protocol import messages as m  # noqa: E402
from protocol.codec import encode  # noqa: E402


def run(rows: int, steps: int, prompt: int) -> dict:
    """One run of `rows` requests at once -> its times."""
    ctx = 1 << max(12, (prompt + steps + 1).bit_length())
    cmd = [sys.executable, "-m", "engine.mock_engine", "--picked", "--token-s", "0", "--chunk-s", "0",
           "--chunk", "2048", "--shape-free", "--max-running", str(rows), "--ctx", str(ctx)]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    engine = subprocess.Popen(cmd, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)
    try:
        while not engine.stdout.readline().startswith("READY"):
            pass
        began = time.perf_counter()
        for i in range(rows):  # (tokens from 3: the mock's end token is 2, and it echoes the prompt back)
            engine.stdin.write(encode(m.Gen(steps, tuple(3 + (j % 1000) for j in range(prompt)),
                                            {"temperature": "0.7", "seed": str(i)}, id=i + 1)) + "\n")
        engine.stdin.flush()
        done = tokens = 0
        while done < rows:
            line = engine.stdout.readline()
            if not line or line.startswith("ERR"):
                raise RuntimeError(f"the mock engine answered {line!r}")
            tokens += line.startswith("T ")
            done += line.startswith("DONE")
        wall = time.perf_counter() - began
        engine.communicate("STOP\n", timeout=60)  # (its last lines read, its input closed)
    finally:
        if engine.poll() is None:
            engine.kill()
            engine.wait()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if tokens != rows * steps:
        raise RuntimeError(f"{tokens} tokens, {rows * steps} expected")
    return {"rows": rows, "step_ms": round(wall / steps * 1e3, 4), "row_us": round(wall / steps / rows * 1e6, 2),
            "engine_cpu_s": round(cpu, 2), "wall_s": round(wall, 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="1,16,64")
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--prompt", type=int, default=500)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--label", default="strata")
    ap.add_argument("--json")
    a = ap.parse_args()
    results = []
    for rows in (int(r) for r in a.rows.split(",")):
        runs = [run(rows, a.steps, a.prompt) for _ in range(a.repeats)]
        med = {k: statistics.median(r[k] for r in runs) for k in ("step_ms", "row_us", "engine_cpu_s")}
        print(f"{rows:4d} rows: {med['step_ms']:.3f} ms a step, {med['row_us']:.1f} us a row "
              f"(runs {', '.join(str(r['step_ms']) for r in runs)} ms), engine CPU {med['engine_cpu_s']:.2f} s",
              flush=True)
        results.append({"rows": rows, "median": med, "runs": runs})
    if a.json:
        out = {"label": a.label, "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs",
               "steps": a.steps, "prompt": a.prompt, "results": results}
        Path(a.json).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
