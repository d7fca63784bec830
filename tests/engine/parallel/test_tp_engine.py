"""Tensor parallel across processes as the engine serves (`strata --serve --tp 3`, engine/parallel/tp_workers.py):
the real default model on the CPU, its 9 heads, 3 K/V heads and 1,536 hidden units split over rank 0
(the engine process) and two worker processes. It answers as the whole model does, parks and resumes
bit-exactly within its TP size (every rank's rows in the fingerprint), runs decode steps between a
long read's layers on every rank alike, and its workers end with it."""
import os
import subprocess
import time
from pathlib import Path

import pytest

from protocol.messages import START_REFUSED
from tests.engine.loop.test_preempt_parity import INTERIM, MAX_NEW, PROMPT, SAMPLING
from tests.harness import PY, ROOT, EngineProcess, alive
from tools.checks import preempt_scenarios as sc

CHUNK = 64
ARGS = ["--serve", "--device", "cpu", "--ctx", "1024", "--chunk", str(CHUNK), "--prefill-preempt",
        "--prefill-preempt-min-tokens", "0"]


@pytest.fixture(scope="module")
def tp():
    e = EngineProcess([PY, "-m", "engine", *ARGS, "--tp", "3", "--decode-interval-ms", "1"])
    e.handshake()
    yield e
    e.close()


@pytest.fixture(scope="module")
def whole():
    e = EngineProcess([PY, "-m", "engine", *ARGS])
    e.handshake()
    yield e
    e.close()


def test_three_ranks_answer_as_the_whole_model(tp, whole):
    assert tp.info["tp"] == "3" and len(tp.info["tp_pids"].split(",")) == 2
    params = SAMPLING["greedy"]
    assert sc.uninterrupted(tp, PROMPT, MAX_NEW, params).tokens == sc.uninterrupted(whole, PROMPT, MAX_NEW, params).tokens


def test_a_park_and_resume_within_the_tp_size_is_bit_exact(tp):
    """A seeded draw with a penalty: the fingerprints hash every rank's rows and the sampler's state."""
    params = SAMPLING["seeded"]
    reference = sc.uninterrupted(tp, PROMPT, MAX_NEW, params)
    out = sc.parked(tp, PROMPT, MAX_NEW, params, CHUNK, [2], INTERIM, 8)
    assert out.parks == [2 * CHUNK] and out.park_fps == out.resume_fps
    assert (out.tokens, out.done_fp) == (reference.tokens, reference.done_fp)


def test_decode_steps_between_a_reads_layers_run_on_every_rank(tp, whole):
    """Two requests decode while A's long prompt is read: with --decode-interval-ms 1 their steps run
    between A's layers, on rank 0 and on the workers in the same places; every answer is its solo one."""
    params = SAMPLING["greedy"]
    long_prompt = PROMPT * 2  # 406 tokens: 7 chunks
    out, decoded, inside = sc.read_beside_decoders(tp, long_prompt, 8, params, INTERIM, 2, 12)
    assert inside >= 3  # decoder steps inside A's first chunk: between its layers
    assert out.tokens == sc.uninterrupted(whole, long_prompt, 8, params).tokens
    assert decoded == sc.decoders_alone(whole, params, INTERIM, 2, 12)


def test_cancel_while_parked_then_serving_goes_on(tp):
    """The workers drop the cancelled request's rows with the next operation (nothing is restored)."""
    done = sc.cancel_while_parked(tp, PROMPT, SAMPLING["greedy"], CHUNK)
    assert done.finish == "cancel" and done.generated == 0
    assert sc.uninterrupted(tp, INTERIM, 8, SAMPLING["greedy"]).finish in ("length", "stop")


def test_the_workers_end_with_the_engine():
    e = EngineProcess([PY, "-m", "engine", *ARGS, "--tp", "3"])
    e.handshake()
    pids = [int(p) for p in e.info["tp_pids"].split(",")]
    assert all(Path(f"/proc/{p}").exists() for p in pids)
    e.proc.kill()  # however it ends: its pipes close and the workers follow
    e.close()
    deadline = time.monotonic() + 20
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(alive(p) for p in pids)


def test_a_split_that_does_not_divide_is_refused_at_start():
    done = subprocess.run([PY, "-m", "engine", *ARGS, "--tp", "2"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, stdin=subprocess.DEVNULL, env=os.environ)
    assert done.returncode == START_REFUSED
    assert "tensor parallel over 2: the model's 9 query heads do not split evenly" in done.stderr
