"""A traced server log ($STRATA_STEP_TRACE=1, engine/loop/step_trace.py) taken apart: for each request, when the
engine took its GEN, when the step that read its prompt's last row ended (its first token), and what the engine
did between; and the gaps where the engine ran no step while requests waited.

    python tools/profiling/trace_waits.py SERVER_LOG[.gz] [--from ID] [--to ID] [--idle-ms 20] [--span S]
    python tools/profiling/trace_waits.py SERVER_LOG[.gz] --rows 64

Prints one line per request (id, prompt tokens, engine wait to its first token, steps before it) and the idle
gaps over --idle-ms with requests waiting (the step that ran when the first GEN came included: a stall that began
before it counts), then the waits' median and largest, counted from each GEN and from the first (a GEN is taken only
between steps, so one that came during a stall is taken after it: counted from the first GEN, the waits match the
clients' first tokens; bench/HISTORY.md, twenty-first session), and the engine's time in the window by kind of step
(prompt, decode, draws, ahead, ...) with what no step covers (`untraced`); --span S sums it over S seconds from the
first GEN instead (a burst's decode phase). --rows R prints, instead, the medians over the whole log of the decode
steps of R rows and the draws lines before them (each numeric field: ms, picks_ms, lines_ms) and the period from one
such decode step's start to the next's.
"""
from __future__ import annotations

import argparse
import gzip
import json
import statistics


def lines(path: str):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", errors="replace") as f:
        for line in f:
            if line.startswith("strata-trace "):
                try:
                    yield json.JSONDecoder().raw_decode(line[len("strata-trace "):])[0]
                except json.JSONDecodeError:
                    continue


def ends(e: dict) -> float:
    """When a traced step ended (its start and its milliseconds)."""
    return e["t"] + e["ms"] / 1000


def waits(events: list[dict], first: int, last: int) -> list[dict]:
    """Per request in [first, last]: gen time, tokens, the end of the step that read its last row."""
    out: dict[int, dict] = {}
    for e in events:
        if e["kind"] == "gen" and first <= e.get("id", -1) <= last:
            out[e["id"]] = {"id": e["id"], "tokens": e.get("tokens"), "gen": e["t"], "steps": 0}
        elif e["kind"] == "prompt":
            end = ends(e)
            for rid, start, stop in e.get("reads", []):
                r = out.get(rid)
                if r is not None and "first" not in r and stop >= (r["tokens"] or 0):
                    r["first"] = end
            for r in out.values():
                if "first" not in r:
                    r["steps"] += 1
        elif e["kind"] == "decode":
            for r in out.values():
                if "first" not in r:
                    r["steps"] += 1
    return [r for r in out.values() if "first" in r]


def idle_gaps(events: list[dict], min_ms: float) -> list[tuple[float, float]]:
    """(start, ms) of the gaps between one step's end and the next step's start of at least min_ms."""
    steps = sorted((e for e in events if e["kind"] != "gen"), key=lambda e: e["t"])
    out, end = [], None
    for e in steps:
        if end is not None and (e["t"] - end) * 1000 >= min_ms:
            out.append((end, (e["t"] - end) * 1000))
        end = max(end or 0.0, ends(e))
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("log")
    p.add_argument("--from", dest="first", type=int, default=0)
    p.add_argument("--to", dest="last", type=int, default=1 << 62)
    p.add_argument("--idle-ms", type=float, default=20.0)
    p.add_argument("--span", type=float, help="seconds from the first GEN over which to sum the engine's time by "
                   "kind (default: to the last first token)")
    p.add_argument("--rows", type=int, help="the medians of the decode steps of this many rows and their draws")
    a = p.parse_args(argv)
    events = list(lines(a.log))
    if a.rows:
        for kind, fields in step_medians(events, a.rows).items():
            print(f"{kind} ({a.rows} rows): " + ", ".join(f"{k} {v:.2f}" for k, v in fields.items()))
        return 0
    found = waits(events, a.first, a.last)
    for r in found:
        print(f"id {r['id']:5d} tokens {r['tokens']:6d} gen {r['gen']:9.3f} first token after "
              f"{(r['first'] - r['gen']) * 1000:8.1f} ms ({r['steps']} steps)")
    if found:
        lo, hi = min(r["gen"] for r in found), max(r["first"] for r in found)
        for start, ms in idle_gaps(in_window(events, lo, hi), a.idle_ms):
            print(f"idle {ms:7.1f} ms from {start:9.3f}")
        ms = [(r["first"] - r["gen"]) * 1000 for r in found]
        burst = [(r["first"] - lo) * 1000 for r in found]
        print(f"{len(ms)} requests: engine wait p50 {statistics.median(ms):.1f} ms, max {max(ms):.1f} ms; from the "
              f"first GEN p50 {statistics.median(burst):.1f} ms, max {max(burst):.1f} ms")
        spent = time_by_kind(events, lo, lo + a.span if a.span else hi)
        print("engine time by kind over " + ", ".join(f"{kind} {ms:.1f} ms" for kind, ms in spent.items()))
    return 0


def time_by_kind(events: list[dict], lo: float, hi: float) -> dict[str, float]:
    """Milliseconds of the traced steps of each kind within [lo, hi] (clipped to it), and `untraced`: the rest of it
    (the engine between its traced steps: taking lines, planning, writing; or idle), the window's `total` last."""
    out: dict[str, float] = {}
    for e in events:
        if e["kind"] == "gen":
            continue
        ms = (min(ends(e), hi) - max(e["t"], lo)) * 1000
        if ms > 0:
            out[e["kind"]] = out.get(e["kind"], 0.0) + ms
    total = (hi - lo) * 1000
    return out | {"untraced": total - sum(out.values()), "total": total}


def step_medians(events: list[dict], rows: int) -> dict[str, dict[str, float]]:
    """The medians of each numeric field of the decode and draws lines of `rows` rows (a decode step's draws line
    comes just before it), and of the decode steps' period (start to start, where two such steps follow each other
    within 50 ms)."""
    steps = [e for e in events if e["kind"] in ("decode", "draws") and e.get("rows") == rows]
    out: dict[str, dict[str, float]] = {}
    for kind in ("draws", "decode"):
        mine = [e for e in steps if e["kind"] == kind]
        fields = sorted({k for e in mine for k, v in e.items() if isinstance(v, (int, float)) and k not in ("t", "rows")})
        out[kind] = {k: statistics.median(e[k] for e in mine if k in e) for k in fields}
        out[kind]["count"] = len(mine)
    decodes = [e for e in steps if e["kind"] == "decode"]
    period = [(b["t"] - a["t"]) * 1000 for a, b in zip(decodes, decodes[1:]) if 0 < b["t"] - a["t"] < 0.05]
    if period:
        out["decode"]["period_ms"] = statistics.median(period)
    return out


def in_window(events: list[dict], lo: float, hi: float) -> list[dict]:
    """The events between lo and hi, and the last step to end by lo (a gap from its end is the window's too)."""
    before = [e for e in events if e["kind"] != "gen" and ends(e) < lo]
    return ([max(before, key=ends)] if before else []) + [e for e in events if ends(e) >= lo and e["t"] <= hi]


if __name__ == "__main__":
    raise SystemExit(main())
