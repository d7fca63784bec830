"""The KV cache's element types (engine/core/kv_types.py): q8_0's round trip and its bound, a pool's rows
stored and copied in their quantized form, attention over a q8_0 pool equal to attention over the
same rows widened, and on the real engine (default model, CPU) with --kv-type q8_0 and f16: a parked
and resumed read equal to the uninterrupted one (tokens and fingerprints), prefix reuse from a
finished, a running and a parked request and from the host tier equal to a cold read, a small pool's
pauses giving every request its solo tokens. The quality cost against the float32 cache is measured
by bench/kv_type_bench.py."""
from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from hypothesis.extra.numpy import arrays

from engine.ops.backend import Step, select_backend
from engine.core.kv_types import Q8_GROUP, Q8Array, check_kv_type, dequantize_q8_0, quantize_q8_0
from tests.harness import PY, ROOT, EngineProcess
from tools.checks import paged_check
from tools.checks import preempt_scenarios as sc

FLOATS = st.floats(-1e4, 1e4, allow_nan=False, allow_infinity=False, width=32)


@given(arrays(np.float32, st.tuples(st.integers(1, 4), st.sampled_from([32, 64, 128])), elements=FLOATS))
def test_q8_0_round_trip_is_within_half_a_step(x):
    q, scale = quantize_q8_0(x)
    assert q.dtype == np.int8 and scale.dtype == np.float16 and scale.shape == (*x.shape[:-1], x.shape[-1] // Q8_GROUP)
    back = dequantize_q8_0(q, scale)
    step = np.repeat(scale.astype(np.float32), Q8_GROUP, axis=-1)
    # half a step of the stored scale, the scale's own float16 rounding at the group's largest value, and
    # float16's range: a group below 127 x 2**-24 in magnitude has a scale that rounds towards zero
    assert np.all(np.abs(back - x) <= step / 2 + np.abs(x) * 2**-10 + 127 * 2**-24)
    assert np.all(np.abs(q) <= 127)
    # stable where the scale is a normal float16 (>= 2**-14: the group's largest value stored as 127 steps): storing
    # it again changes nothing. Below, the scale's steps are coarser than a 127th of it, a group's largest can be 126
    # steps, and storing it again may take the neighbouring scale (hypothesis: 32 x 0.00051957 -> 126 x 69 x 2**-24,
    # then 127 x 68 x 2**-24): no path stores a KV row twice (the pool copies blocks in their quantized form).
    again = dequantize_q8_0(*quantize_q8_0(back))
    normal = np.repeat(scale.astype(np.float32) >= 2**-14, Q8_GROUP, axis=-1)
    assert np.array_equal(again[normal], back[normal])
    assert np.all(np.abs(again - back) <= step / 2 + np.abs(back) * 2**-10 + 127 * 2**-24)


def test_zero_groups_and_exact_values():
    x = np.zeros((2, 64), np.float32)
    x[1, 32:] = np.arange(32) - 16  # integers up to 16 in magnitude: a scale of 16/127 holds them closely
    q, scale = quantize_q8_0(x)
    assert not q[0].any() and not scale[0].any() and np.array_equal(dequantize_q8_0(q, scale)[0], x[0])
    assert np.abs(dequantize_q8_0(q, scale)[1] - x[1]).max() < 0.07


def test_a_q8_pool_stores_quantized_rows_and_copies_them_as_they_are():
    rng = np.random.default_rng(0)
    pool = Q8Array.zeros((3, 2, 4, 64))  # (blocks, kv_heads, block_size, d)
    rows = rng.standard_normal((5, 2, 64)).astype(np.float32)  # five positions' K rows
    blocks, offsets = np.array([0, 0, 2, 2, 1]), np.array([0, 3, 1, 2, 0])
    pool[blocks, :, offsets] = rows  # as rope_store writes them
    q, scale = quantize_q8_0(rows)
    assert np.array_equal(pool.q[blocks, :, offsets], q) and np.array_equal(pool.scale[blocks, :, offsets], scale)
    copy = pool[np.array([2, 0])]  # a snapshot's blocks, raw
    other = Q8Array.zeros(pool.shape)
    other[np.array([1, 2])] = copy  # restored elsewhere: the same bytes
    assert np.array_equal(other.q[1], pool.q[2]) and np.array_equal(other.scale[2], pool.scale[0])
    assert pool.nbytes == pool.q.size * (1 + 2 / Q8_GROUP)


@settings(max_examples=10, deadline=None)
@given(st.integers(1, 40), st.integers(0, 88))  # start + n within the 8 blocks of 16
def test_attention_over_a_q8_pool_equals_attention_over_its_rows_widened(n, start):
    """The NumPy backend's attention reads a q8_0 pool as the float32 rows it stands for."""
    backend = select_backend("cpu")
    rng = np.random.default_rng(n * 100 + start)
    kv_heads, heads, d, size = 2, 4, 64, 16
    table = rng.permutation(8).astype(np.int32)  # (blocks of the sequence,) in a scattered order
    q8_k, q8_v = Q8Array.zeros((8, kv_heads, size, d)), Q8Array.zeros((8, kv_heads, size, d))
    f_k, f_v = np.zeros((8, kv_heads, size, d), np.float32), np.zeros((8, kv_heads, size, d), np.float32)
    at = np.arange(start + n)
    blocks, offsets = table[at // size], at % size
    k, v = rng.standard_normal((2, start + n, kv_heads, d)).astype(np.float32)
    q8_k[blocks, :, offsets], q8_v[blocks, :, offsets] = k, v
    f_k[blocks, :, offsets] = dequantize_q8_0(*quantize_q8_0(k))
    f_v[blocks, :, offsets] = dequantize_q8_0(*quantize_q8_0(v))
    query = rng.standard_normal((n, heads, d)).astype(np.float32)
    step = Step(n, start, (table,))
    assert np.array_equal(backend.ops.attention(query, q8_k, q8_v, step), backend.ops.attention(query, f_k, f_v, step))


def test_types_the_backend_cannot_hold_are_refused_clearly():
    with pytest.raises(ValueError, match="not available on the GPU"):
        check_kv_type("f32", "gpu", 128)
    with pytest.raises(ValueError, match="choose one of"):
        check_kv_type("q4_0", "cpu", 128)
    with pytest.raises(ValueError, match="multiple of 32"):
        check_kv_type("q8_0", "cpu", 80)
    check_kv_type("q8_0", "cpu", 64)
    check_kv_type("f16", "gpu", 128)
    check_kv_type("q8_0", "gpu", 128)


# ---------------------------------------------------------------- the real engine with each type

CHUNK = 32
CASES = json.loads((ROOT / "tests/fixtures/logits_golden.json").read_text())["cases"]
PROMPT = CASES[3]["ids"][:166] + CASES[0]["ids"]  # 203 tokens: 6 full chunks and a partial one
GREEDY = {"temperature": 0.0, "seed": 0}


@pytest.mark.parametrize("kv_type", ["q8_0", "f16"])
def test_a_parked_read_resumes_exactly_with_each_cache_type(kv_type):
    with EngineProcess([PY, "-m", "engine", "--serve", "--device", "cpu", "--ctx", "1024", "--chunk", str(CHUNK),
                        "--kv-type", kv_type, "--prefill-preempt", "--prefill-preempt-min-tokens", "0"]) as engine:
        engine.handshake()
        assert engine.info["kv_type"] == kv_type
        reference = sc.uninterrupted(engine, PROMPT, 12, GREEDY)
        out = sc.parked(engine, PROMPT, 12, GREEDY, CHUNK, [2, 5], CASES[1]["ids"], 4)
        assert out.parks == [64, 160] and out.park_fps == out.resume_fps
        assert (out.tokens, out.done_fp) == (reference.tokens, reference.done_fp)


@pytest.mark.timeout(900)
def test_the_pool_keeps_every_answer_exact_with_a_q8_0_cache(tmp_path):
    """tools/checks/paged_check.py's reuse and host-tier checks, where the cache's type shows (its blocks
    kept, found and copied out and back); tests/engine/kvcache/test_kv_pool_real.py runs every check,
    the type-blind pressure group too, on the default type."""
    out = tmp_path / "report.json"
    code = paged_check.main(["--device", "cpu", "--chunk", "32", "--max-new", "8", "--batch", "6",
                             "--engine-args", "--kv-type q8_0", "--only", "reuse", "host", "--json", str(out)])
    report = json.loads(out.read_text())
    assert code == 0 and len(report) == 4 and all(row["ok"] for row in report), json.dumps(report, indent=1)[-4000:]
    checks = {row["check"]: row for row in report}
    assert checks["reuse from the host tier after eviction"]["from_host"] == 96
