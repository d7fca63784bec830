"""sbq.cu, issue 48's probe of the super-block integer order, its CUDA source run on the host (host_cuda.py; mma.sync
emulated as PTX lays out its fragments): x in Q8K (a float scale a super-block) bit for bit as its NumPy form, the
solo kernel within float32's rounding of gguf's weights times x's values, and each row of x the solo kernel's bits
in every n-tile kernel, whichever rows are beside it, however the grid splits x's rows among warps (in fp16 out,
those bits rounded once), and with k in segments (a chain each, added in order) as the solo kernel's same segments."""
import numpy as np
import pytest

from gguf import GGMLQuantizationType, quants
from tests.engine.kernels.host_cuda import HostKernels, compiler
from tests.engine.kernels.test_quant_blocks_host import random_blocks
from tools.device.sbq_check import Q8K_BYTES, q8k, repack_q6k

M, K = 40, 1280  # 40 weight rows: two whole 16-row tiles and a partial one; 5 super-blocks: a partial round of 4
BLOCKS = K // 256


def values(blocks: np.ndarray) -> np.ndarray:
    """Q8K blocks (n, k / 256, 288) -> the values they stand for (n, k) float64."""
    q = blocks[..., :256].view(np.int8).astype(np.float64)
    d = blocks[..., 272:276].copy().view(np.float32).astype(np.float64)
    return (q * d).reshape(blocks.shape[0], -1)


def solo_rows(fn, kind: str, raw: np.ndarray, xq: np.ndarray, seg: int) -> np.ndarray:
    """Each row of x (Q8K blocks (n, k / 256, 288)) alone by the solo kernel against raw's (m, bytes) weights, k's
    chains a segment of seg super-blocks -> (n, m) float32."""
    (m, _), (n, blocks, _) = raw.shape, xq.shape
    out = np.full((n, m), np.nan, dtype=np.float32)
    for b in range(n):
        fn[f"sbq_{kind}_n1_f32"](((m + 3) // 4,), (128,), (raw, xq[b], out[b], np.int32(m), np.int32(256 * blocks),
                                                           np.int32(seg)))
    return out


def tile_rows(fn, kind: str, raw: np.ndarray, xs: np.ndarray, nt: int, splits: int = 1, seg: int | None = None,
              out=None) -> np.ndarray:
    """The rows of x (Q8K blocks xs) together through the n-tile kernel of nt tiles, the grid's y splitting them among
    warps, k in segments of seg super-blocks (all of k by default) added by sbq_sum_parts -> (n, m), float32 unless
    out is given (fp16 out: rounded once)."""
    (m, _), (n, blocks, _) = raw.shape, xs.shape
    seg = blocks if seg is None else seg
    parts = -(-blocks // seg)
    out = np.full((n, m), np.nan, dtype=np.float32) if out is None else out
    part = np.full((parts, n, m), np.nan, dtype=np.float32) if parts > 1 else None
    fn[f"sbq_{kind}_t{nt}{'' if out.dtype == np.float16 and parts == 1 else '_f32'}"](
        ((m + 63) // 64, splits, parts), (128,),
        (raw, xs, out, np.int32(m), np.int32(256 * blocks), np.int32(m), np.int32(n), np.int32(seg), part))
    if parts > 1:
        fn["sbq_sum_parts_f32"](((n * m + 127) // 128,), (128,), (part, out, np.int32(m), np.int32(n), np.int32(m),
                                                                 np.int32(parts)))
    return out


@pytest.mark.parametrize("kind", ["Q4_K", "Q6_K"])
def test_super_block_sums_give_every_row_its_solo_bits_and_the_weights_values(kind, tmp_path):
    assert compiler() is not None, "a C++ compiler (g++) is needed to run the kernels on the CPU"
    raw = random_blocks(kind, M * K // 256, seed=19).reshape(M, -1)
    x = (np.random.default_rng(23).standard_normal((19, K)) * 0.5).astype(np.float16)
    x[3, :256] = 0  # a super-block of zeros: d = 0
    names = ("quantize_q8k", f"sbq_{kind}_n1_f32", f"sbq_{kind}_t4", *(f"sbq_{kind}_t{nt}_f32" for nt in (1, 2, 4, 8)),
             "sbq_sum_parts_f32", *(("sbq_Q6_KP_n1_f32", "sbq_Q6_KP_t4_f32") if kind == "Q6_K" else ()))
    fn = HostKernels("sbq.cu", tmp_path, names)
    xq = np.zeros((19, K // 256, Q8K_BYTES), dtype=np.uint8)
    fn["quantize_q8k"](((19 * K // 256 * 32 + 127) // 128,), (128,), (x, xq, np.int32(19 * K // 256)))
    assert np.array_equal(xq, q8k(x))

    def solo(seg: int, kind: str = kind, raw: np.ndarray = raw) -> np.ndarray:  # (19, M): each row of x alone
        return solo_rows(fn, kind, raw, xq, seg)

    def tiles(rows: slice, nt: int, splits: int = 1, seg: int = BLOCKS, out=None, kind: str = kind,
              raw: np.ndarray = raw) -> np.ndarray:
        return tile_rows(fn, kind, raw, xq[rows], nt, splits, seg, out)

    alone = solo(BLOCKS)
    w = quants.dequantize(raw, GGMLQuantizationType[kind]).reshape(M, K).astype(np.float64)
    want = values(xq) @ w.T
    np.testing.assert_allclose(alone, want, rtol=0, atol=2e-5 * float(np.abs(want).max()))

    for n, nt in ((1, 1), (5, 1), (13, 2), (19, 4), (9, 8), (19, 8)):
        assert np.array_equal(tiles(slice(0, n), nt), alone[:n]), (n, nt)
    for nt, splits in ((1, 3), (2, 2)):  # x's rows split among warps by the grid's y (8 nt rows each)
        assert np.array_equal(tiles(slice(None), nt, splits), alone), (nt, splits)
    assert np.array_equal(tiles(slice(3, 19), 2), alone[3:19])  # the same rows at other places of the tiles
    half = tiles(slice(None), 4, out=np.full((19, M), np.nan, dtype=np.float16))  # fp16 out: the sums rounded once
    assert np.array_equal(half, alone.astype(np.float16))

    for seg in (1, 2, 3):  # k split in segments (the grid's z), their chains added in order: the solo kernel's
        split = solo(seg)  # bits with the same segments
        np.testing.assert_allclose(split, want, rtol=0, atol=2e-5 * float(np.abs(want).max()))
        for n, nt, splits in ((1, 1, 1), (19, 4, 1), (19, 1, 3)):
            assert np.array_equal(tiles(slice(0, n), nt, splits, seg), split[:n]), (seg, n, nt, splits)
        if kind == "Q6_K":  # repacked into 212-byte blocks (4-byte aligned loads): the same bits
            padded = repack_q6k(raw)
            assert padded.shape == (M, BLOCKS * 212)
            assert np.array_equal(solo(seg, "Q6_KP", padded), split)
            assert np.array_equal(tiles(slice(None), 4, 1, seg, kind="Q6_KP", raw=padded), split)


def test_the_device_check_runs_through_on_the_host(tmp_path, monkeypatch):
    """tools/device/sbq_check.py end to end on the host at small shapes: its bit checks (every route, split and
    repack), its timings with a stand-in clock, the forward's sums and its report, so that a device call is not spent
    on a Python error."""
    import json
    from types import SimpleNamespace

    import tools.device.sbq_check as check
    from engine.kernels.model_parts import ModelKernels
    from tests.engine.kernels.host_gpu import HostCupy, host_gpu_backend

    monkeypatch.setattr(check, "SHAPES", {"wqkv": ("Q4_K", 48, 512), "wo": ("Q4_K", 32, 512),
                                          "w_gate_up": ("Q4_K", 64, 512), "w_down": ("Q6_K", 32, 1024),
                                          "head": ("Q6_K", 80, 512)})
    monkeypatch.setattr(check, "ODD", [(37, 512)])
    monkeypatch.setattr(check, "ROWS", (1, 9, 17))
    monkeypatch.setattr(check, "TIMED_ROWS", (1, 9, 17))
    cp = HostCupy()
    cp.cuda = SimpleNamespace(**vars(HostCupy.cuda),
                              runtime=SimpleNamespace(getDeviceProperties=lambda i: {"name": b"NVIDIA H100 (host)"}))
    kernels = host_gpu_backend(ModelKernels(frozenset({"Q4_K", "Q6_K"}), 128, 4), tmp_path / "gpu").ops.kernels
    clock = iter(range(1, 10**6))  # ms: every launch timed slower than the one before
    out = tmp_path / "sbq_check.json"
    fn = HostKernels("sbq.cu", tmp_path, check.Sbq.NAMES)
    build = lambda defines: HostKernels("sbq.cu", tmp_path, check.Sbq.NAMES, defines=defines)  # noqa: E731
    assert check.main(["--json", str(out)], cp=cp, kernels=kernels, sbq_fn=fn, sbq_build=build,
                      timer=lambda cp, launch: (launch(), float(next(clock)))[1]) == 0
    report = json.loads(out.read_text())
    assert report["ok"] and all(c["rows_equal_alone"] == c["cases"] for c in report["checks"])
    assert set(report["times"]) == set(check.SHAPES) and "padded_parts" in report["times"]["head"]["17"]
    assert report["forward"]["17"]["today_ms"] > 0
    assert report["times"]["wo"]["17"]["limit_fraction"]["today"] is not None  # (an H100 by its name)
    assert report["forward"]["mixed_routes"]["wo"] == "today"  # (the stand-in clock: each route slower than the last)
    assert all(r["equal_default"] for lanes in check.SOLO_LANES
               for r in report["knobs"][f"solo {lanes} lanes a super-block"].values())


def test_the_engine_s_matvec_takes_the_super_block_order_where_asked_and_every_row_keeps_its_bits(tmp_path):
    """GpuKernels.matvec with sbq set ($STRATA_SBQ=1): a matrix of Q4_K and Q6_K parts (a QKV whose V rows are
    Q6_K) against 70 rows of x (two launches of tiles, k in sbq_parts' segments) gives each row the bits it has
    alone (the solo kernel), near gguf's values times x's Q8K values."""
    from engine.core.quantized import QuantMatrix, QuantPart
    from engine.kernels.matvec_launch import MatvecLaunchers, sbq_parts

    parts = [("Q4_K", 24), ("Q6_K", 16)]
    assert [sbq_parts(rows, K) for _, rows in parts] == [BLOCKS, BLOCKS]  # small matrices: a segment a super-block
    raws = [random_blocks(kind, rows * K // 256, seed=29 + i).reshape(rows, -1) for i, (kind, rows) in enumerate(parts)]
    w = QuantMatrix(tuple(QuantPart(kind, raw, rows) for (kind, rows), raw in zip(parts, raws)), K)
    x = (np.random.default_rng(31).standard_normal((70, K)) * 0.5).astype(np.float16)
    m = MatvecLaunchers()
    m.cp, m.sbq = np, True
    m.fn = HostKernels("sbq.cu", tmp_path, ("quantize_q8k", "sbq_sum_parts_f32",
                                            *(f"sbq_{kind}_{v}_f32" for kind, _ in parts for v in ("n1", "t1", "t8"))))
    y = m.matvec(w, x, np.float32)  # (70, 40)
    alone = np.stack([m.matvec(w, row, np.float32) for row in x])
    assert np.array_equal(y, alone)
    weights = np.concatenate([quants.dequantize(raw, GGMLQuantizationType[kind]).reshape(rows, K)
                             for (kind, rows), raw in zip(parts, raws)]).astype(np.float64)
    want = values(q8k(x)) @ weights.T
    np.testing.assert_allclose(y, want, rtol=0, atol=2e-5 * float(np.abs(want).max()))


def test_a_matrix_takes_its_segments_of_k_by_its_shape():
    from engine.kernels.matvec_launch import sbq_parts

    assert sbq_parts(4096, 4096) == 8 and sbq_parts(4096, 14336) == 8  # 256 tiles: wo, w_down of the 8B
    assert sbq_parts(28672, 4096) == 2 and sbq_parts(128256, 4096) == 1  # gate/up, the head
    assert sbq_parts(4096, 512) == 2  # no more segments than super-blocks


@pytest.mark.parametrize("lanes", [2, 4, 8])
def test_the_solo_kernel_gives_a_long_row_the_tile_kernel_s_bits_at_every_lane_count(lanes, tmp_path):
    """A row of 37 super-blocks (the solo kernel's rounds whole and a part, at 2, 4 or 8 lanes a super-block,
    SBQ_SOLO_LANES), k in segments that end inside a round: each row of x has the tile kernel's bits, which no lane
    count changes, for Q4_K and the repacked Q6_K."""
    m, k, blocks = 8, 37 * 256, 37
    x = (np.random.default_rng(41).standard_normal((3, k)) * 0.5).astype(np.float16)
    fn = HostKernels("sbq.cu", tmp_path, ("quantize_q8k", "sbq_sum_parts_f32",
                                          *(f"sbq_{kind}_{v}_f32" for kind in ("Q4_K", "Q6_KP") for v in ("n1", "t1"))),
                     defines=(f"SBQ_SOLO_LANES={lanes}",))
    xq = np.zeros((3, blocks, Q8K_BYTES), dtype=np.uint8)
    fn["quantize_q8k"](((3 * blocks * 32 + 127) // 128,), (128,), (x, xq, np.int32(3 * blocks)))
    for kind, raw in (("Q4_K", random_blocks("Q4_K", m * blocks, seed=43).reshape(m, -1)),
                      ("Q6_KP", repack_q6k(random_blocks("Q6_K", m * blocks, seed=47).reshape(m, -1)))):
        for seg in (blocks, 7):
            alone = solo_rows(fn, kind, raw, xq, seg)
            tiled = tile_rows(fn, kind, raw, xq, 1, seg=seg)
            assert np.array_equal(alone, tiled), (kind, seg)
