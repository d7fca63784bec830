"""Whether a server is up, for the device scripts' waits: exit status 0 when /health answers 200, 1 while it is not
yet (starting, restarting, no answer), 2 when its engine could not be started (the reason printed: waiting longer
would not help).

    python tools/device/server_health.py [URL]     (default http://127.0.0.1:8080)
"""
from __future__ import annotations

import sys

import httpx


def main() -> int:
    url = sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:8080"
    try:
        r = httpx.get(url + "/health", timeout=2)
    except httpx.HTTPError:
        return 1
    if r.status_code == 200:
        return 0
    try:
        body = r.json()
    except ValueError:
        return 1
    if body.get("status") == "failed":
        print(f"the server's engine could not be started: {body.get('error', '(no reason given)')}")
        return 2
    return 1


if __name__ == "__main__":
    sys.exit(main())
