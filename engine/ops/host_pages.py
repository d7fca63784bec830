"""A CPU engine's start allocates its arrays on the kernel's 4 KiB pages, not transparent huge pages.

NumPy asks for transparent huge pages on every large array (madvise(MADV_HUGEPAGE)), and Linux's default THP
defrag policy ("madvise") makes a process that asks wait while the kernel compacts memory for each 2 MiB page
it cannot find free. On a host whose memory is fragmented by the page cache (a machine that has read files
for a while) that wait dominates a start: the first touch of the Qwen2.5-0.5B fixture's 2.4 GB of expanded
weights took 15-20 s of an 18.9 s start, against 3.4 s on plain pages, the whole start 4.1 s (bench/README.md,
"The CPU engine's start"). The steady state pays about 2% of the CPU decode step (4 KiB pages' TLB misses over
the weights, measured on the same machine), so only the start's allocations (the weights, the KV pool, the
warm-up's scratch) are taken this way; the arrays made while serving keep NumPy's default.
"""
from __future__ import annotations

import contextlib
from typing import Iterator

import numpy as np


def _huge_page_switch():
    """NumPy's switch for its madvise(MADV_HUGEPAGE) (None where this NumPy has none: nothing to turn off)."""
    core = getattr(np, "_core", None) or getattr(np, "core", None)
    return getattr(getattr(core, "multiarray", None), "_set_madvise_hugepage", None)


@contextlib.contextmanager
def plain_pages(active: bool = True) -> Iterator[None]:
    """Within: NumPy's new arrays are not madvised to huge pages (when active); NumPy's setting after."""
    switch = _huge_page_switch() if active else None
    before = switch(False) if switch else None
    try:
        yield
    finally:
        if switch:
            switch(before)
