"""What the host's memory holds and has left, as the kernel reports it (no third-party import: the server reads
it too)."""
from __future__ import annotations

import os


def available_memory() -> int:
    """Bytes of host memory the kernel says a new process may take (MemAvailable: free pages and those it can
    reclaim, a model file's cached pages among them); very large if unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 2**62


def host_memory_bytes() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 16 << 30
