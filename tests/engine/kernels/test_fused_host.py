"""quant.cu's fused decode kernels run on the host (host_cuda.py) against the launches each stands for, byte for
byte (tools/checks/fused_kernels.py: gate/up then SwiGLU; a projection then the residual add and the norm): the
ordering a fused kernel must keep to give a decode row the bits it had, before a GPU checks the same cases; and a
model's lone decode row, which takes them, against the same row decoded in a batch, which does not."""
import collections
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from engine.core.quantized import BLOCKS
from engine.runner.runner import ModelRunner
from engine.kernels.fused_launch import FusedLaunchers
from engine.kernels.matvec_launch import MatvecLaunchers
from engine.kernels.norm_rope_launch import NormRopeLaunchers
from engine.kvcache.recurrent import SequenceState
from tests.engine.kernels.host_cuda import HostKernels
from tests.engine.kernels.host_gpu import host_gpu_model
from tools.checks.fused_kernels import KINDS, fused_cases, norm_case
from tools.profiling.decode_launches import counted


ROOT = Path(__file__).resolve().parents[3]


class Launchers(MatvecLaunchers, NormRopeLaunchers, FusedLaunchers):
    """GpuKernels' matvec, norm and fused launchers over NumPy and the host's kernels."""


@pytest.fixture(scope="module")
def kernels(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("fused")
    m = Launchers()
    m.cp, m.fn = np, {}
    for kind in KINDS:
        part = 2 * list(BLOCKS).index(kind)  # engine/kernels/model_parts.py's layout of quant.cu
        names = ("quantize_q8", f"matvec_{kind}_n1", f"matvec_act_{kind}", f"matvec_norm_{kind}")
        folder = workdir / kind
        folder.mkdir()
        m.fn.update(HostKernels("quant.cu", folder, names, defines=("PARTS=30", f"PART={part}")))
    m.fn.update(HostKernels("norm_rope.cu", workdir, ("add_rms_norm", "silu_mul")))
    m.stage, m.pairs, m.mmq_from, m.sms = False, False, 1 << 30, 1
    m.norm_counter = np.zeros(1, dtype=np.int32)
    return m


@pytest.mark.parametrize("kind", KINDS)
def test_a_fused_kernel_gives_the_bits_of_the_launches_it_replaces(kernels, kind):
    cases = list(fused_cases(kernels, np, kinds=(kind,)))
    assert len(cases) == 4, cases  # two kernels at two shapes
    assert [case for case in cases if not case[2]] == []
    assert kernels.norm_counter[0] == 0  # put back by each launch's last block


def test_the_norm_in_a_matvec_s_last_block_sums_as_the_norm_kernel_does(kernels):
    """Wide rows whose outputs sit at fp16 rounding midpoints (midpoint_weights): a scale one fp32 ulp off rounds
    some of them the other way. (A sum of the norm threads' partials paired otherwise moves the scale in about one
    row of three here; the device check takes twenty.)"""
    rng = np.random.default_rng(3)
    assert [trial for trial in range(3) if not norm_case(kernels, np, "Q8_0", 12288, 32, rng)] == []


def small_llama(tmp_path) -> Path:
    """A small Llama in Q4_K_M (Q4_K and Q6_K matrices), the hybrid fixtures' small vocabulary."""
    path = tmp_path / "llama.gguf"
    subprocess.run([sys.executable, str(ROOT / "tools/fixtures/make_synthetic_gguf.py"), str(path), "--layers", "2",
                    "--dim", "256", "--ffn", "512", "--heads", "4", "--kv-heads", "2", "--ctx", "512", "--tied",
                    "--type", "Q4_K_M", "--tokenizer", str(ROOT / "tests/fixtures/hybrid/qwen3next.gguf")],
                   check=True, capture_output=True)
    return path


@pytest.mark.parametrize("model", ["llama Q4_K_M", "qwen3next IQ3_S"])
def test_a_lone_decode_row_through_the_fused_kernels_equals_its_row_in_a_batch(model, tmp_path):
    """On the host-run GPU backend, each sequence's decode step alone (the fused kernels: gate/up with SwiGLU, the
    out projections with the next norm) gives the logits, bit for bit, of its row in a step of two (the matvecs,
    SwiGLU and norms apart): a request's tokens do not depend on whether another decodes beside it. A small
    Llama, and the IQ3_S Qwen3-Next fixture (its mixers' rows, gated sums and recurrent states too)."""
    path = small_llama(tmp_path) if model.startswith("llama") else ROOT / "tests/fixtures/iq/qwen3next-IQ3_S.gguf"
    backend, cfg, weights = host_gpu_model(path, tmp_path)
    runner = ModelRunner(cfg, weights, backend, ctx=512, chunk=64, eos_ids=frozenset(), max_running=2,
                         cuda_graphs=False)
    tables = [runner.pool.allocate(runner.pool.blocks_for(9)) for _ in range(2)]
    states = [None if runner.recurrent is None else SequenceState.fresh(runner.recurrent) for _ in tables]
    for r, (table, state) in enumerate(zip(tables, states)):
        runner.forward(np.arange(8, dtype=np.int64) * 5 + r, 0, table, want_logits=True, state=state)
    def after_read():  # each decode step below starts from a copy of the states the reads left (a step advances
        # the states it takes)
        return [None if s is None else SequenceState(s.now.copy(), s.mark.copy(), s.now_at, s.mark_at) for s in states]

    backend.ops.kernels.fused_matvec = True  # (opt-in: engine/kernels/fused_launch.py)
    fn, launched = backend.ops.kernels.fn, collections.Counter()
    fn.update({name: counted(launch, name, launched) for name, launch in fn.items()})
    together = np.array(runner.decode_logits([3, 5], tables, [8, 8], [s for s in after_read() if s is not None]))
    assert not any(name.startswith(("matvec_act", "matvec_norm")) for name in launched)
    launched.clear()
    alone = [np.array(runner.decode_logits([token], [table], [8], [] if state is None else [state]))[0]
             for token, table, state in zip([3, 5], tables, after_read())]
    assert any(name.startswith("matvec_act") for name in launched) and any(name.startswith("matvec_norm")
                                                                            for name in launched)
    assert runner.recurrent is not None or "silu_mul" not in launched  # (a mixture's routed experts have their own)
    assert np.isfinite(together).all() and together.std() > 0
    assert np.array_equal(np.stack(alone), together)
