"""argmax.cu's batched temperature draws (pick_keys, a sort of every row's keys, pick_draw: a block of 1,024
threads a row, meeting at its barriers), the CUDA source itself run on the host (host_cuda.py) through their
launcher (engine/kernels/argmax_launch.py pick_rows): each row's token is draw_segmented's, the NumPy
transcription the host sampler is checked against (tests/engine/runner/test_batch_draws.py), and a row's token
is the same alone as beside other rows."""
import numpy as np
import pytest

from engine.kernels.argmax_launch import ArgmaxLauncher
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
    launcher.fn = HostKernels("argmax.cu", tmp_path_factory.mktemp("argmax"), ("pick_keys", "pick_draw"))
    return launcher


def pick_rows(draws, logits, params, us) -> list[int]:
    table = np.array([[p.temperature, p.top_k, p.top_p, p.min_p, u] for p, u in zip(params, us)], dtype=np.float64)
    out = np.zeros(len(logits), dtype=np.int64)
    draws.pick_rows(np.ascontiguousarray(logits, dtype=np.float32), table, out)
    return [int(t) for t in out]


def test_each_row_s_token_is_draw_segmented_s_alone_or_beside_others(draws):
    logits = np.stack([model_like_logits(seed, VOCAB) for seed in range(4)])
    us = [0.1, 0.5, 0.93, 0.999]
    together = pick_rows(draws, logits, PARAMS, us)
    want = [draw_segmented(scale(row, p), u, p) for row, p, u in zip(logits, PARAMS, us)]
    assert together == want
    assert [pick_rows(draws, logits[i : i + 1], PARAMS[i : i + 1], us[i : i + 1])[0] for i in (0, 3)] == [want[0],
                                                                                                          want[3]]
