"""A server's /health as a script waiting for it reads it: ready, not yet (starting, restarting, no answer), or its
engine could not be started (waiting longer would not help), with the reason the server gives. The benches, the
device scripts and the tests' harness wait through it.

    python bench/server_health.py [URL]     exit status 0 ready, 1 not yet, 2 failed (the reason printed)
"""
from __future__ import annotations

import sys

import httpx

READY, WAITING, FAILED = 0, 1, 2  # (the command's exit statuses)


def server_health(url: str, timeout_s: float = 2.0) -> tuple[int, str]:
    """(READY, ""), (WAITING, what it answered) or (FAILED, why its engine could not be started)."""
    try:
        r = httpx.get(url + "/health", timeout=timeout_s)
    except httpx.HTTPError as e:
        return WAITING, type(e).__name__
    if r.status_code == 200:
        return READY, ""
    try:
        body = r.json()
    except ValueError:
        return WAITING, f"HTTP {r.status_code} {r.text[:80]}"
    if body.get("status") == "failed":
        return FAILED, body.get("error") or "(no reason given)"
    return WAITING, f"HTTP {r.status_code} {body}"


def main() -> int:
    state, said = server_health(sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:8080")
    if state == FAILED:
        print(f"the server's engine could not be started: {said}")
    return state


if __name__ == "__main__":
    sys.exit(main())
