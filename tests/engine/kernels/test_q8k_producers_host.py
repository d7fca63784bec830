"""The producers of a decode step's rows write their Q8K super-blocks too where sbq.cu's matvecs read them
($STRATA_SBQ=1: GpuKernels.sbq), so no quantize_q8k launch runs for them: norm_rope.cu's norms and SwiGLU and
attention.cu's decode output, their CUDA source run on the host (host_cuda.py), each row's super-blocks the bytes
that quantize_q8k (and its NumPy form, tools/device/sbq_check.py q8k) makes of the fp16 row the kernel stored; where
a row's width is not whole super-blocks (or an attention block's outputs are not) none are written and the matvec
quantizes the rows itself."""
import json

import numpy as np
import pytest

from engine.core.deferred import GatedSum
from engine.core.step import Step, pack_tables
from engine.kernels import attention_launch, norm_rope_launch
from engine.kernels.attention_launch import MAX_COUNTER_HEADS, AttentionLaunchers
from engine.kernels.device_steps import DeviceSteps
from engine.kernels.limits import COUNTER_SEQUENCES
from engine.kernels.norm_rope_launch import NormRopeLaunchers
from engine.kvcache.kv import KVCache
from engine.model.forward import LlamaModel
from tests.engine.kernels.host_cuda import HostKernels, compiler
from tests.engine.kernels.host_gpu import HostCupy, host_gpu_model
from tools.device import q8k_check
from tools.device.sbq_check import q8k
from tools.fixtures.make_synthetic_gguf import main as make_synthetic

FILLED = 276  # a Q8K block's bytes that carry something: q (256), the units' sums (16), d (4); then padding


def same_blocks(row8) -> bool:
    """Whether the Row8's super-blocks are NumPy's Q8K of its fp16 values, byte for byte."""
    return np.array_equal(row8.q8k[..., :FILLED], q8k(row8.values.reshape(row8.values.shape[0], -1))[..., :FILLED])


@pytest.fixture(scope="module")
def norms(tmp_path_factory):
    assert compiler() is not None, "a C++ compiler (g++) is needed to run the kernels on the CPU"
    k = NormRopeLaunchers()
    k.cp, k.sbq = np, True
    k.fn = HostKernels("norm_rope.cu", tmp_path_factory.mktemp("norm_rope_q8k"),
                       ("add_rms_norm", "add_gated_rms_norm", "silu_mul"))
    return k


def test_the_norms_and_swiglu_write_the_rows_q8k_as_quantize_q8k_makes_it(norms):
    rng = np.random.default_rng(5)
    n, dim, ffn = 3, 768, 512
    x = rng.standard_normal((n, dim)).astype(np.float32)
    x[1] *= 1e-3  # a row of small values: d far from 1
    w = (1 + 0.1 * rng.standard_normal(dim)).astype(np.float32)
    delta = rng.standard_normal((n, dim)).astype(np.float16)
    normed = norms.add_rms_norm(x.copy(), delta, w, 1e-6, q8=True)
    assert normed.q8k.shape == (n, dim // 256, 288) and same_blocks(normed)
    gated = GatedSum(*(rng.standard_normal((n, dim)).astype(np.float16) for _ in range(3)),
                     (0.05 * rng.standard_normal(dim)).astype(np.float32))
    assert same_blocks(norms.add_gated_rms_norm(x.copy(), gated, w, 1e-6, q8=True))
    gate_up = (2 * rng.standard_normal((n, 2 * ffn))).astype(np.float16)
    act = norms.silu_mul(gate_up, q8=True)
    assert act.q8k.shape == (n, ffn // 256, 288) and same_blocks(act)
    assert act.row(2).q8k.shape == (1, 2, 288) and np.array_equal(act.row(2).q8k, act.q8k[2:])  # a row's own
    assert norms.silu_mul(gate_up[:, : 2 * 96], q8=True).q8k is None  # a width of 96: not whole super-blocks
    assert norms.silu_mul(gate_up, q8=True, matvec=False).q8k is None  # the experts' kernels read Q8 units only
    assert norms.add_rms_norm(x.copy(), delta, w, 1e-6).__class__ is np.ndarray  # no 8-bit form asked: the rows


def test_a_decode_step_s_attention_output_comes_with_its_q8k(tmp_path):
    assert compiler() is not None, "a C++ compiler (g++) is needed to run the kernels on the CPU"
    a = AttentionLaunchers()
    a.cp, a.sms, a.sbq = np, 4, True
    a.counters = np.zeros(COUNTER_SEQUENCES * MAX_COUNTER_HEADS, dtype=np.int32)
    a.fn = HostKernels("attention.cu", tmp_path, ("flash_decode_d256_g2",), defines=("PARTS=21", "PART=20"))
    rng = np.random.default_rng(9)
    d, block, heads, kv_heads = 256, 64, 4, 2  # a block two query heads: 512 outputs, two super-blocks
    positions = (70, 700)
    tables = [[0, 1], list(range(2, 2 + -(-701 // block)))]
    k_cache, v_cache = (rng.standard_normal((tables[-1][-1] + 1, kv_heads, block, d)).astype(np.float16)
                        for _ in range(2))
    width = max(len(t) for t in tables)
    step = Step(2, -1, tuple(tables), positions, pos0=np.asarray(positions, dtype=np.int32),
                table=pack_tables(tables, width), table_off=np.arange(0, 2 * width, width, dtype=np.int32))
    out = a.decode_attention(rng.standard_normal((2, heads, d)).astype(np.float16), k_cache, v_cache, step, q8=True)
    assert out.q8k.shape == (2, heads * d // 256, 288) and same_blocks(out)
    a.sbq = False
    assert a.decode_attention(rng.standard_normal((2, heads, d)).astype(np.float16), k_cache, v_cache, step,
                              q8=True).q8k is None


def test_a_decode_takes_the_producers_q8k_with_the_bits_quantize_q8k_gives_and_fewer_launches(tmp_path, monkeypatch):
    """A two-layer Q4_K_M model (its V and down projections and head Q6_K) decoded on the host-emulated GPU with
    sbq.cu's matvecs: the logits of every step bit for bit those of the same decode where the matvecs quantize each
    row themselves (the producers' super-blocks withheld), and no quantize_q8k launch (counted): every matvec's rows
    come from a norm, the attention or SwiGLU."""
    assert compiler() is not None, "a C++ compiler (g++) is needed to run the kernels on the CPU"
    path = str(tmp_path / "tiny-q4_k_m.gguf")
    make_synthetic([path, "--layers", "2", "--dim", "256", "--ffn", "512", "--heads", "2", "--kv-heads", "1",
                    "--head-dim", "128", "--ctx", "256", "--type", "Q4_K_M"])
    monkeypatch.setenv("STRATA_SBQ", "1")  # (the kernels' build takes sbq.cu)
    backend, cfg, weights = host_gpu_model(path, tmp_path / "gpu")
    kernels = backend.ops.kernels
    kernels.sbq = True
    quantize = kernels.fn["quantize_q8k"]
    launches = []
    kernels.fn["quantize_q8k"] = lambda *a, **kw: (launches.append(a[0]), quantize(*a, **kw))[1]

    def decode(tokens: list[int]) -> list[np.ndarray]:
        model, kv = LlamaModel(cfg, weights, backend), KVCache(cfg, 64, backend)
        return [np.asarray(model.forward(np.asarray([t]), i, kv, want_logits=True)) for i, t in enumerate(tokens)]

    tokens = [5, 900, 17, 4000]
    fused = decode(tokens)
    assert launches == []
    for module in (attention_launch, norm_rope_launch):
        monkeypatch.setattr(module, "q8k_blocks", lambda *a: None)
    launches.clear()
    apart = decode(tokens)
    assert len(launches) == len(tokens) * (4 * 2 + 1)  # QKV, the output and FFN projections of each layer, the head
    for a, b in zip(fused, apart):
        assert a.dtype == np.float32 and np.isfinite(a).all() and np.array_equal(a, b)


def test_the_device_check_runs_through_on_the_host(tmp_path):
    """tools/device/q8k_check.py as the device runs it, over the host's kernels and smaller widths (a head group of
    two 256-wide heads: the part of attention.cu built here)."""
    assert compiler() is not None, "a C++ compiler (g++) is needed to run the kernels on the CPU"

    class Launchers(NormRopeLaunchers, AttentionLaunchers, DeviceSteps):
        pass

    k, cp = Launchers(), HostCupy()
    k.cp, k.sms = cp, 4
    k.counters = cp.zeros(COUNTER_SEQUENCES * MAX_COUNTER_HEADS, dtype=np.int32)
    (tmp_path / "norm").mkdir(), (tmp_path / "att").mkdir()
    k.fn = HostKernels("norm_rope.cu", tmp_path / "norm", ("add_rms_norm", "silu_mul"))
    k.fn.update(HostKernels("attention.cu", tmp_path / "att", ("flash_decode_d256_g2",),
                            defines=("PARTS=21", "PART=20")))
    out = tmp_path / "q8k.json"
    shapes = {"dim": 512, "ffn": 768, "head_dim": 256, "heads": 4, "kv_heads": 2, "block": 64}
    assert q8k_check.main(["--json", str(out)], cp=cp, kernels=k, shapes=shapes) == 0
    assert len(json.loads(out.read_text())["results"]) == 10
