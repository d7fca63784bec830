"""A process that ends with the one that started it (Linux's parent-death signal): the engine's
tensor-parallel workers (engine/parallel/tp_workers.py), and the servers the tests start (tests/harness.py,
as their preexec_fn)."""
from __future__ import annotations

import contextlib
import ctypes
import signal

PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """SIGTERM to this process when its parent dies (elsewhere than Linux: nothing)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
