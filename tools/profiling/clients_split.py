"""Where a burst of clients' slowest first token went (bench/pool_bench.py's clients case, run against Strata): per
run, the clients' TTFT p99 beside the server's own, and for the slowest client when it was sent (after the burst's
first send), the server's intake (its request's arrival to its place in line: the body parsed, templated, tokenized),
the server's time to its first token and to its first text (which token completed it), all counted from the request's
arrival at the server; `outside` is the client's TTFT less the server's time to the first text: before the arrival
(the connection) and after the text went out (the delivery, the client's reading).

    python tools/profiling/clients_split.py POOL_JSON [--label strata]
"""
from __future__ import annotations

import argparse
import json


def split(run: dict) -> dict:
    slow = run.get("slowest") or {}
    first_text = slow.get("server_first_text_s")
    return {"ttft_p99_s": run.get("ttft_p99_s"), "server_ttft_p99_s": run.get("server_ttft_p99_s"),
            "slowest_ttft_s": slow.get("ttft_s"), "sent_after_s": slow.get("sent_after_s"),
            "intake_s": slow.get("server_intake_s"), "server_ttft_s": slow.get("server_ttft_s"),
            "first_text_s": first_text, "first_text_token": slow.get("first_text_token"),
            "outside_s": None if first_text is None or slow.get("ttft_s") is None
            else round(slow["ttft_s"] - first_text, 3)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("pool_json")
    p.add_argument("--label", default="strata")
    a = p.parse_args(argv)
    runs = json.load(open(a.pool_json))[a.label]["cases"]["clients"]["runs"]
    for i, run in enumerate(runs, 1):
        print(f"run {i}: " + json.dumps(split(run)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
