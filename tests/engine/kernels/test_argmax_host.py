"""argmax.cu's batched temperature draws (pick_keys, a sort of every row's keys or pick_top's select of each row's
top_k first, pick_draw: a block of 1,024 threads a row, meeting at its barriers), the CUDA source itself run on the
host (host_cuda.py) through their launcher (engine/kernels/argmax_launch.py pick_rows): each row's token is
draw_segmented's, the NumPy transcription the host sampler is checked against (tests/engine/runner/test_batch_draws.py),
a row's token is the same alone as beside other rows, and pick_top finds exactly the sort's first top_k keys, ties of
equal logits and a flat row among them."""
import numpy as np
import pytest

from engine.kernels.argmax_launch import KEY_THREADS, TOP_MAX, TOP_THREADS, ArgmaxLauncher, index_bits
from engine.runner.batch_draws import draw_segmented
from engine.runner.sampler import SamplingParams, scale
from tests.engine.kernels.host_cuda import HostKernels, compiler
from tests.engine.runner.test_batch_draws import model_like_logits

PARAMS = [SamplingParams(temperature=0.8), SamplingParams(temperature=1.0, top_p=0.9),
          SamplingParams(temperature=0.7, top_k=40, min_p=0.05), SamplingParams(temperature=1.3, min_p=0.1, top_p=0.95)]
VOCAB = 3001  # not a multiple of the key kernel's 256 threads


@pytest.fixture(scope="module")
def draws(tmp_path_factory):
    assert compiler() is not None, "a C++ compiler (g++) is needed to run the kernels on the CPU"
    launcher = ArgmaxLauncher()
    launcher.cp = np
    launcher.fn = HostKernels("argmax.cu", tmp_path_factory.mktemp("argmax"), ("pick_keys", "pick_top", "pick_draw"))
    return launcher


def pick_rows(draws, logits, params, us, top: bool = False) -> list[int]:
    table = np.array([[p.temperature, p.top_k, p.top_p, p.min_p, u] for p, u in zip(params, us)], dtype=np.float64)
    out = np.zeros(len(logits), dtype=np.int64)
    draws.pick_rows(np.ascontiguousarray(logits, dtype=np.float32), table, out, top)
    return [int(t) for t in out]


def test_each_row_s_token_is_draw_segmented_s_alone_or_beside_others(draws):
    logits = np.stack([model_like_logits(seed, VOCAB) for seed in range(4)])
    us = [0.1, 0.5, 0.93, 0.999]
    together = pick_rows(draws, logits, PARAMS, us)
    want = [draw_segmented(scale(row, p), u, p) for row, p, u in zip(logits, PARAMS, us)]
    assert together == want
    assert [pick_rows(draws, logits[i : i + 1], PARAMS[i : i + 1], us[i : i + 1])[0] for i in (0, 3)] == [want[0],
                                                                                                          want[3]]


TOP = [SamplingParams(temperature=0.7, top_k=40, min_p=0.05), SamplingParams(temperature=1.0, top_k=1),
       SamplingParams(temperature=0.8, top_k=256, top_p=0.95), SamplingParams(temperature=1.3, top_k=7, top_p=0.5)]


def test_pick_top_draws_the_sorts_tokens_ties_and_flat_rows_among_them(draws):
    logits = np.stack([model_like_logits(seed, VOCAB) for seed in range(4)])
    logits[1, ::3] = logits[1].max()  # a thousand ties at the top: the first indices win, as in the sort
    logits[2] = np.round(logits[2], 1)  # few distinct values: ties everywhere
    logits[3] = 0.0  # flat: every key ties on the value
    for us in ([0.1, 0.5, 0.93, 0.999], [0.999, 0.0, 0.5, 0.25]):
        want = [draw_segmented(scale(row, p), u, p) for row, p, u in zip(logits, TOP, us)]
        assert pick_rows(draws, logits, TOP, us, top=True) == pick_rows(draws, logits, TOP, us) == want
        alone = [pick_rows(draws, logits[i : i + 1], TOP[i : i + 1], us[i : i + 1], top=True)[0] for i in range(4)]
        assert alone == want


@pytest.mark.parametrize("n, ks", [(VOCAB, (1, 40, 255, 256)), (128256, (40,))])  # (Llama 3's: 17 index bits)
def test_pick_top_keeps_a_rows_first_keys_in_the_sorts_order(draws, n, ks):
    """pick_top's output against the sorted keys themselves (what pick_draw reads), for several top_k."""
    logits = np.stack([model_like_logits(seed, n) for seed in range(3)])
    logits[2, 100:200] = logits[2].max()
    for k in ks:
        params = [SamplingParams(temperature=0.9, top_k=k)] * 3
        table = np.array([[p.temperature, p.top_k, p.top_p, p.min_p, 0.5] for p in params], dtype=np.float64)
        bits = index_bits(n)
        scaled = np.empty((3, n), dtype=np.float32)
        keys = np.empty(3 * n, dtype=np.uint64)
        draws.fn["pick_keys"]((-(-n // KEY_THREADS), 3), (KEY_THREADS,),
                              (np.ascontiguousarray(logits, dtype=np.float32), table, scaled, keys, np.int32(n),
                               np.int32(bits)))
        top = np.zeros(3 * TOP_MAX, dtype=np.uint64)
        draws.fn["pick_top"]((3,), (TOP_THREADS,), (keys, table, top, np.int32(n), np.int32(bits)))
        ordered = np.sort(keys.reshape(3, n), axis=1)
        got = top.reshape(3, TOP_MAX)
        assert (got[:, :k] == ordered[:, :k]).all(), k
        assert (got[:, k:] == np.uint64(2**64 - 1)).all(), k
