"""A step's log-probabilities on the GPU (engine/runner/logprob_rows.py over argmax.cu's row_logprobs), the CUDA
source run on the host (tests/engine/kernels/host_cuda.py): each row's token log-probability and top tokens are
the host sampler's (Sampler.logprobs, fp64 over the row) within rounding, and a row's figures are the same bits
scored alone as beside other rows, whether its logits are its own or a row of a decode step's output."""
import numpy as np
import pytest

from engine.kernels.argmax_launch import ArgmaxLauncher
from engine.runner.logprob_rows import LogprobRows
from engine.runner.sampler import Sampler, SamplingParams
from engine.runner.sequence import Sequence
from tests.engine.kernels.host_cuda import HostKernels, compiler
from tests.engine.kernels.host_gpu import HostCupy, host
from tests.engine.runner.test_batch_draws import model_like_logits

VOCAB = 3001  # not a multiple of the kernel's 256 threads


class Decoder:
    """A decode step's output as LogprobRows reads it: the rows' logits and their argmax."""

    def __init__(self, logits: np.ndarray):
        self.logits = host(logits)

    def greedy_token(self, row: int) -> int:
        return int(np.argmax(self.logits[row]))


@pytest.fixture(scope="module")
def kernels(tmp_path_factory):
    assert compiler() is not None, "a C++ compiler (g++) is needed to run the kernels on the CPU"
    launcher = ArgmaxLauncher()
    launcher.cp = HostCupy()
    launcher.fn = HostKernels("argmax.cu", tmp_path_factory.mktemp("logprobs"), ("row_logprobs",))
    return launcher


def request(logits, temperature: float = 0.0, top: int = 0, graph_row: int | None = None) -> Sequence:
    seq = Sequence(id=1, prompt=(1, 2, 3), max_new=8, sampler=Sampler(SamplingParams(temperature=temperature),
                                                                       (1, 2, 3)), stop_ids=frozenset(), logprobs=top)
    seq.logits, seq.graph_row = host(logits), graph_row
    return seq


def test_each_row_is_the_host_samplers_figures_and_the_same_alone_or_beside_others(kernels):
    step = np.stack([model_like_logits(seed, VOCAB) for seed in range(5)])  # (rows, vocab)
    decoder = Decoder(step)
    rows = LogprobRows(HostCupy(), kernels, decoder)
    together = [request(decoder.logits[i], graph_row=i, top=3) for i in range(5)]
    together[2].sampler = Sampler(SamplingParams(temperature=0.8), (1, 2, 3))  # a sampled row: its token drawn ahead
    together[2].picked = 17
    rows.ahead(together)
    assert all(seq.scored is not None for seq in together)
    for i, seq in enumerate(together):
        token = 17 if i == 2 else int(np.argmax(step[i]))
        assert seq.scored[0] == token
        logprob, top = rows.logprobs(seq, token)
        alone = rows.logprobs(request(step[i].copy(), top=3), token)  # its own logits, a batch of one
        assert (logprob, top) == alone  # the same bits
        want, want_top = Sampler(SamplingParams(), (1, 2, 3)).logprobs(step[i], token, 3)
        assert logprob == pytest.approx(want, abs=1e-12) and logprob < 0
        assert [t for t, _ in top] == [t for t, _ in want_top]
        assert [v for _, v in top] == pytest.approx([v for _, v in want_top], abs=1e-12)
        assert seq.scored is None  # taken


def test_a_figure_scored_ahead_for_another_token_is_scored_again(kernels):
    logits = model_like_logits(7, VOCAB)
    rows = LogprobRows(HostCupy(), kernels, Decoder(logits[None]))
    seq = request(logits, temperature=0.8)
    seq.picked = 5
    rows.ahead([seq])
    assert seq.scored[0] == 5
    logprob, _ = rows.logprobs(seq, 9)
    assert logprob == pytest.approx(Sampler(SamplingParams(), (1, 2, 3)).logprobs(logits, 9, 0)[0], abs=1e-12)


def test_rows_not_known_ahead_or_not_asking_are_left_to_their_draw(kernels):
    logits = model_like_logits(3, VOCAB)
    rows = LogprobRows(HostCupy(), kernels, None)
    sampled = request(logits, temperature=0.8)  # its token not drawn yet
    silent = request(logits)
    silent.logprobs = None
    penalized = request(logits)
    penalized.sampler = Sampler(SamplingParams(repeat_penalty=1.3), (1, 2, 3))  # its logits changed on the host
    rows.ahead([sampled, silent, penalized])
    assert [s.scored for s in (sampled, silent, penalized)] == [None, None, None]
    assert not penalized.sampler.plain and sampled.sampler.plain
