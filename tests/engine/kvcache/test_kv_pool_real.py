"""The KV pool's guarantees on the real engine and the default model, on the CPU, through
tools/checks/paged_check.py at small sizes (the H200 runs the same checks at full size): a prompt whose
start another request read (finished, still decoding, parked, or evicted and copied back from the
host tier) gives the tokens and the state fingerprint of a cold read; requests decoding together give their solo tokens; a pool too small for all of them
defers and pauses, and every answer is still its solo answer."""
import json

import pytest

from tools.checks import paged_check


@pytest.mark.timeout(900)  # three engines and ~20 requests on a shared 2-core machine: minutes
def test_the_pool_keeps_every_answer_exact_on_the_real_engine(tmp_path):
    out = tmp_path / "report.json"
    code = paged_check.main(["--device", "cpu", "--chunk", "32", "--max-new", "8", "--batch", "4",
                             "--json", str(out)])
    report = json.loads(out.read_text())
    assert code == 0, json.dumps(report, indent=1)[-4000:]
    checks = {row["check"]: row for row in report}
    assert len(checks) == 6 and all(row["ok"] for row in report)
    assert checks["reuse from a finished request"]["cached"] == 96  # three whole chunks of 32
    assert checks["reuse from a parked read"]["cached"] == 32
    assert checks["reuse from the host tier after eviction"]["from_host"] == 96
    pressure = checks["a small pool defers and pauses, and every answer equals its solo run"]
    assert pressure["deferred"] + pressure["paused"] > 0 and pressure["answers_equal"] == 4
