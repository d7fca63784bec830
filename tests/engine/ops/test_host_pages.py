"""A CPU engine's start takes plain 4 KiB pages (engine/ops/host_pages.py): an array made within plain_pages is
not madvised to transparent huge pages (the kernel's own record of the mapping, /proc/self/smaps' VmFlags, says
so), one made after is as NumPy makes it, and NumPy's setting comes back even when the block raises."""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from engine.ops.host_pages import _huge_page_switch, plain_pages
from tests.harness import ROOT

SMAPS = Path("/proc/self/smaps")
pytestmark = pytest.mark.skipif(not SMAPS.exists() or _huge_page_switch() is None,
                                reason="Linux with a NumPy that madvises huge pages")


def vm_flags(a: np.ndarray) -> set[str]:
    """The flags of the mapping holding a's middle byte (NumPy madvises from the page after the first byte's)."""
    address, inside = a.ctypes.data + a.nbytes // 2, False
    for line in SMAPS.read_text().splitlines():
        head = line.split()[0]
        if "-" in head and ":" not in head:
            lo, hi = (int(x, 16) for x in head.split("-"))
            inside = lo <= address < hi
        elif inside and line.startswith("VmFlags:"):
            return set(line.split()[1:])
    raise AssertionError("no mapping holds the array")


def numpy_setting() -> bool:
    switch = _huge_page_switch()
    before = switch(True)
    switch(before)
    return bool(before)


def test_arrays_made_within_are_not_madvised_to_huge_pages_and_the_setting_comes_back():
    """In a fresh process of its own: in a test worker that has run others, malloc may serve the array from memory
    an earlier array left madvised (a heap's top keeps its flags), and this test failed once in a clean clone's make
    test with "hg" on the array made within."""
    done = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"default": True, "within": False, "inside_hg": False, "outside_hg": True,
                                       "after": True}


PROBE = """
import json
import numpy as np
from engine.ops.host_pages import plain_pages
from tests.engine.ops.test_host_pages import numpy_setting, vm_flags
out = {"default": numpy_setting()}  # NumPy's on Linux 4.6 and later
with plain_pages():
    out["within"] = numpy_setting()
    inside = np.empty(64 << 20, np.uint8)  # large enough for a mapping of its own
outside = np.empty(64 << 20, np.uint8)
out |= {"inside_hg": "hg" in vm_flags(inside), "outside_hg": "hg" in vm_flags(outside), "after": numpy_setting()}
print(json.dumps(out))
"""


def test_the_setting_comes_back_when_the_block_raises_and_inactive_changes_nothing():
    with pytest.raises(RuntimeError):
        with plain_pages():
            raise RuntimeError("a failed load")
    assert numpy_setting()
    with plain_pages(active=False):  # (the GPU engine's start)
        assert numpy_setting()
