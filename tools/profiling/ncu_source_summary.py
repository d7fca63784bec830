"""Where a kernel's instructions and stalls are, from Nsight Compute's source page (the CSV that
`ncu --import REP --page source --csv --print-source sass` prints; tools/profiling/gpu_profile_decode.py
--detail writes it as detail_<rows>rows_source.txt).

    python tools/profiling/ncu_source_summary.py detail_64rows_source.txt [--kernel 2] [--top 12]

For each profiled launch (or the --kernel'th alone): the warp instructions executed, by opcode; the
code regions, a region being the instructions executed equally often (a loop body runs its
instructions the same number of times), with their instructions per execution, their share of the
instructions and of the stall samples; and the stall reasons' shares of all samples.
"""
from __future__ import annotations

import argparse
import csv
import io
import sys
from collections import Counter


def launches(text: str) -> list[tuple[str, list[dict]]]:
    """The CSV's sections: (kernel name, one dict per SASS line)."""
    out, lines = [], text.split("\n")
    starts = [i for i, line in enumerate(lines) if line.startswith('"Kernel Name"')]
    for a, b in zip(starts, starts[1:] + [len(lines)]):
        name = next(csv.reader([lines[a]]))[1]
        rows = list(csv.DictReader(io.StringIO("\n".join(lines[a + 1 : b]))))
        out.append((name, [r for r in rows if r.get("Source")]))
    return out


def opcode(source: str) -> str:
    words = source.split()
    op = words[1] if words[0].startswith("@") and len(words) > 1 else words[0]
    return op.split(".")[0]


def number(value: str | None) -> float:
    return float(value) if value else 0.0


def summary(rows: list[dict], top: int) -> dict:
    executed = Counter()
    by_op, regions, region_samples = Counter(), Counter(), Counter()
    stalls = Counter()
    samples = 0.0
    for r in rows:
        n = int(number(r.get("Instructions Executed")))
        s = number(r.get("Warp Stall Sampling (All Samples)"))
        by_op[opcode(r["Source"])] += n
        regions[n] += 1
        region_samples[n] += s
        executed[n] += n
        samples += s
        for key, value in r.items():
            if key and key.startswith("stall_") and "Not Issued" not in key:
                stalls[key[6:]] += number(value)
    total = sum(by_op.values()) or 1
    samples = samples or 1
    return {
        "instructions": total,
        "opcodes": [(op, n, n / total) for op, n in by_op.most_common(top)],
        "regions": sorted(((times, count, times * count / total, region_samples[times] / samples)
                           for times, count in regions.items() if times), key=lambda x: -x[2])[:top],
        "stalls": [(k, v / samples) for k, v in stalls.most_common(top)],
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("csv")
    p.add_argument("--kernel", type=int, help="only the n-th profiled launch (from 0)")
    p.add_argument("--top", type=int, default=12)
    a = p.parse_args()
    found = launches(open(a.csv).read())
    if not found:
        print(f"{a.csv}: no 'Kernel Name' sections (not ncu's source page as CSV?)", file=sys.stderr)
        return 1
    chosen = range(len(found)) if a.kernel is None else [a.kernel]
    for i in chosen:
        if not 0 <= i < len(found):
            print(f"--kernel {i}: the file has launches 0..{len(found) - 1}", file=sys.stderr)
            return 1
        name, rows = found[i]
        s = summary(rows, a.top)
        print(f"[{i}] {name}: {s['instructions']:,} warp instructions")
        print("  opcodes: " + ", ".join(f"{op} {share:.1%}" for op, _, share in s["opcodes"]))
        print("  regions (executions x instructions: share of instructions, of stall samples):")
        for times, count, share, sampled in s["regions"]:
            print(f"    {times:>10,} x {count:>4}: {share:6.1%} {sampled:6.1%}")
        print("  stalls: " + ", ".join(f"{k} {v:.1%}" for k, v in s["stalls"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
