"""Where a decode step's GPU time goes, kernel by kernel: one replay of the engine's decode graph
(one request's step, or a batch's with --rows) under Nsight Compute, each kernel's duration and DRAM bytes, summed
per kernel and launch shape, against the step's replay time measured without the profiler. ncu runs
the kernels one at a time, each with its own launch and ramp, so their sum exceeds the replay by
what programmatic dependent launch overlaps (engine/kernels/launch.py).

    python tools/profiling/gpu_profile_decode.py --model PATH [--context 512] [--rows 1] [--json OUT --label NAME]

It runs itself under `ncu` (--inner); the hardware counters need a runtime that lets ncu read them
(the device README's Firecracker machines do).
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

METRICS = ("gpu__time_duration.sum", "dram__bytes_read.sum", "dram__bytes_write.sum")


def inner(a) -> None:
    """The step's replay time (median of a.repeats), or with a.profiled one warm replay between the
    profiler's start and stop."""
    import cupy as cp
    import numpy as np

    from engine.ops.backend import select_backend
    from engine.runner.decode_graph import GraphDecoder
    from engine.model.weights import load_model
    from engine.kvcache.kv import DEFAULT_BLOCK, KVCache
    from engine.model.forward import LlamaModel

    backend = select_backend("gpu")
    cfg, weights, _ = load_model(a.model, backend)
    model = LlamaModel(cfg, weights, backend)
    per = -(-(a.context + 16) // DEFAULT_BLOCK)  # a sequence's blocks
    kv = KVCache(cfg, a.context + 16, backend, blocks=a.rows * per, kv_type=a.kv_type)
    tokens = np.random.default_rng(0).integers(100, cfg.vocab_size - 100, a.context + 8)
    model.forward(tokens[: a.context], 0, kv, want_logits=False)  # the first sequence's rows (the others' are
    # zeros: a batch row's attention reads as many keys either way)
    graphs = GraphDecoder(model, kv, backend)
    pos = a.context
    step = ([int(tokens[pos])] * a.rows, [np.arange(i * per, (i + 1) * per, dtype=np.int32) for i in range(a.rows)],
            [pos] * a.rows)  # every row's token, block table and position
    graphs.decode(*step)  # the capture
    entry, times = graphs.entry(a.rows, pos), []
    for _ in range(a.repeats):
        start, end = cp.cuda.Event(), cp.cuda.Event()
        start.record(graphs.stream)
        graphs.replay(entry, *step)
        end.record(graphs.stream)
        end.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, end))
    if not a.profiled:  # the replay's own time, with no profiler attached
        Path(a.inner).write_text(json.dumps({"replay_ms": statistics.median(times), "layers": cfg.n_layers}))
        return
    cp.cuda.profiler.start()
    graphs.decode(*step)
    cp.cuda.runtime.deviceSynchronize()
    cp.cuda.profiler.stop()


def kernels_of(csv_path: Path) -> list[dict]:
    """ncu's raw CSV (one row per metric and kernel, base units) -> one dict per kernel launch."""
    launches: dict[str, dict] = {}
    lines = [line for line in csv_path.read_text().splitlines() if line.startswith('"')]
    for row in csv.DictReader(lines):
        k = launches.setdefault(row["ID"], {"name": row["Kernel Name"], "grid": row["Grid Size"],
                                            "block": row["Block Size"]})
        k[row["Metric Name"]] = float(row["Metric Value"].replace(",", ""))
    return list(launches.values())


def summary(launches: list[dict], replay_ms: float, layers: int) -> dict:
    groups: dict[tuple, dict] = defaultdict(lambda: {"launches": 0, "us": 0.0, "bytes": 0.0})
    for k in launches:
        g = groups[(k["name"].split("(")[0], k["grid"], k["block"])]
        g["launches"] += 1
        g["us"] += k["gpu__time_duration.sum"] / 1e3
        g["bytes"] += k["dram__bytes_read.sum"] + k["dram__bytes_write.sum"]
    total_us = sum(g["us"] for g in groups.values())
    rows = []
    for (name, grid, block), g in sorted(groups.items(), key=lambda kv: -kv[1]["us"]):
        rows.append({"kernel": name, "grid": grid, "block": block, "launches": g["launches"],
                     "us_total": round(g["us"], 2), "us_each": round(g["us"] / g["launches"], 2),
                     "share": round(g["us"] / total_us, 4), "mb_each": round(g["bytes"] / g["launches"] / 1e6, 3),
                     "tb_s": round(g["bytes"] / (g["us"] * 1e-6) / 1e12, 2) if g["us"] else 0.0})
    dram = sum(g["bytes"] for g in groups.values())
    return {"replay_ms": round(replay_ms, 4), "kernels": len(launches), "kernels_per_layer": round(len(launches) / layers, 1),
            "kernels_ms": round(total_us / 1e3, 4), "overlapped_ms": round(total_us / 1e3 - replay_ms, 4),
            "dram_gb": round(dram / 1e9, 3), "tb_s_over_kernels": round(dram / (total_us * 1e-6) / 1e12, 2),
            "tb_s_over_replay": round(dram / (replay_ms * 1e-3) / 1e12, 2), "by_kernel": rows}


def detail(a, run: list[str]) -> int:
    """ncu's full set for the matching kernels of one profiled replay: the details page (throughputs,
    warp stalls, pipe use) and the SASS with each instruction's samples, as text under a.detail_out."""
    out = Path(a.detail_out)
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"detail_{a.rows}rows"
    rep = stem.with_suffix(".ncu-rep")
    done = subprocess.run([a.ncu, "--clock-control", "none", "--profile-from-start", "off", "--set", "full",
                           "--import-source", "no", "-k", f"regex:{a.detail}", "--launch-count", str(a.detail_count),
                           "-f", "-o", str(rep), *run, "--profiled"], capture_output=True, text=True)
    if done.returncode != 0 or not rep.exists():
        print(done.stdout[-3000:], done.stderr[-3000:], sep="\n")
        return 1
    pages = {"details": ["--page", "details"], "source": ["--page", "source", "--csv", "--print-source", "sass"]}
    for name, args in pages.items():
        text = subprocess.run([a.ncu, "--import", str(rep), *args], capture_output=True, text=True)
        Path(f"{stem}_{name}.txt").write_text(text.stdout + text.stderr)
    print(f"wrote {stem}_details.txt and {stem}_source.txt")
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--model", required=True)
    p.add_argument("--context", type=int, default=512)
    p.add_argument("--rows", type=int, default=1, help="sequences decoded together (a batch step)")
    p.add_argument("--kv-type", default="auto", help="the KV cache's type (f16, q8_0; auto: the engine's default)")
    p.add_argument("--repeats", type=int, default=100, help="unprofiled replays timed (median)")
    p.add_argument("--ncu", default=os.environ.get("NCU", "ncu"))
    p.add_argument("--json")
    p.add_argument("--label")
    p.add_argument("--detail", metavar="REGEX", help="instead: ncu's full sections (stalls, pipes, source) for the "
                   "kernels whose names match, the first --detail-count launches -> --detail-out/NAME.txt")
    p.add_argument("--detail-count", type=int, default=6)
    p.add_argument("--detail-out", default=".")
    p.add_argument("--inner", help=argparse.SUPPRESS)  # a run of the step: where to write its replay time
    p.add_argument("--profiled", action="store_true", help=argparse.SUPPRESS)  # the run under ncu
    a = p.parse_args()
    if a.inner:
        inner(a)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        timing, report = Path(tmp) / "timing.json", Path(tmp) / "ncu.csv"
        run = [sys.executable, __file__, "--model", a.model, "--context", str(a.context), "--rows", str(a.rows),
               "--kv-type", a.kv_type, "--repeats", str(a.repeats), "--inner", str(timing)]
        ncu = [a.ncu, "--clock-control", "none", "--cache-control", "none", "--profile-from-start", "off",
               "--metrics", ",".join(METRICS), "--csv", "--print-units", "base", "--log-file", str(report)]
        if a.detail:
            return detail(a, run)
        done = subprocess.run(run, capture_output=True, text=True)  # timed alone: ncu slows every launch
        if done.returncode == 0:
            done = subprocess.run([*ncu, *run, "--profiled"], capture_output=True, text=True)
        if done.returncode != 0 or not timing.exists() or not report.exists():
            print(done.stdout[-3000:], done.stderr[-3000:], sep="\n")
            print("the profile did not complete", file=sys.stderr)
            return 1
        t = json.loads(timing.read_text())
        out = summary(kernels_of(report), t["replay_ms"], t["layers"])
    out = {"model": Path(a.model).name, "context": a.context, "rows": a.rows, "kv_type": a.kv_type, **out}
    print(f"{out['model']}, {a.rows} row{'s' if a.rows > 1 else ''} at context {a.context}: replay {out['replay_ms']} ms, {out['kernels']} kernels "
          f"({out['kernels_per_layer']} a layer) summing to {out['kernels_ms']} ms one at a time, {out['overlapped_ms']} ms "
          f"more than the replay; DRAM {out['dram_gb']} GB = {out['tb_s_over_kernels']} TB/s over the kernels, "
          f"{out['tb_s_over_replay']} over the replay")
    print(f"{'kernel':44} {'grid':>16} {'n':>4} {'us each':>8} {'us all':>8} {'share':>6} {'MB each':>8} {'TB/s':>5}")
    for r in out["by_kernel"]:
        print(f"{r['kernel'][:44]:44} {r['grid']:>16} {r['launches']:>4} {r['us_each']:>8} {r['us_total']:>8} "
              f"{r['share']:>6.1%} {r['mb_each']:>8} {r['tb_s']:>5}")
    if a.json:
        path = Path(a.json)
        results = json.loads(path.read_text()) if path.exists() else {}
        results[a.label or f"{out['model']} x{a.rows}"] = out
        path.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
