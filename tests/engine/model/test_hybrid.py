"""The hybrid families (engine/model/hybrid.py) on tiny synthetic files of each (tools/fixtures/make_synthetic_gguf.py):
a prompt's logits are the same bits however its read is cut at the delta rule's chunk boundaries,
read again from its mark, or beside another read; and on the real engine process a request's
tokens are the same alone, beside others reading and decoding, and parked and resumed. (Their
agreement with transformers is tests/engine/model/test_hybrid_reference.py's.)"""
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from engine.kvcache.recurrent import SequenceState
from engine.model.weights import load_model
from engine.ops.backend import cpu_backend
from engine.runner.runner import ModelRunner
from protocol import messages as m
from tests.harness import PY, EngineProcess
from tools.checks import preempt_scenarios as sc

ROOT = Path(__file__).resolve().parents[3]
SHAPE = ["--layers", "4", "--dim", "64", "--ffn", "96", "--heads", "2", "--kv-heads", "1", "--head-dim", "64",
         "--experts", "4", "--experts-used", "2", "--expert-ffn", "32", "--shared-ffn", "32", "--interval", "2",
         "--rope-dim", "16", "--conv-kernel", "4", "--linear-k-heads", "2", "--linear-v-heads", "4",
         "--linear-dk", "16", "--linear-dv", "16", "--ctx", "2048", "--type", "F32"]  # untied: varied greedy tokens
ARCHES = ("qwen3next", "qwen35", "qwen35moe")
CHUNK = 64


@pytest.fixture(scope="module", params=ARCHES)
def model_file(request, tmp_path_factory):
    path = tmp_path_factory.mktemp("hybrid") / f"{request.param}.gguf"
    subprocess.run([sys.executable, str(ROOT / "tools/fixtures/make_synthetic_gguf.py"), str(path), "--arch",
                    request.param, *SHAPE, "--seed", "7"], check=True, capture_output=True)
    return path


@pytest.fixture(scope="module")
def runner(model_file):
    backend = cpu_backend()
    cfg, weights, _ = load_model(str(model_file), backend)
    return ModelRunner(cfg, weights, backend, ctx=1024, chunk=CHUNK, eos_ids=frozenset(), max_running=4)


def fresh(runner) -> SequenceState:
    return SequenceState.fresh(runner.recurrent)


def read(runner, ids, table, cuts, state=None):
    """ids read from position 0 in pieces ending at `cuts` (then at its end), as the engine does (each
    read from the state's mark); the last logits on the host."""
    state = state or fresh(runner)
    pos = 0
    for end in [*cuts, len(ids)]:
        pos = state.rewind()
        logits = runner.forward(ids[pos:end], pos, table, want_logits=end == len(ids), state=state)
        state.read(pos, end - pos)
    return np.array(logits), state


@pytest.mark.parametrize("cuts", [[64], [64, 128], [128], [100]])
def test_a_read_cut_at_chunk_boundaries_or_read_again_from_its_mark_gives_the_same_bits(runner, cuts):
    ids = np.random.default_rng(1).integers(0, runner.vocab_size, 150)
    table = list(range(runner.pool.blocks_for(160)))
    whole, whole_state = read(runner, ids, table, [])
    got, state = read(runner, ids, table, cuts)  # a cut at 100 is read again from 64, its mark
    assert np.array_equal(got, whole)
    assert state.now.equals(whole_state.now) and state.mark.equals(whole_state.mark) and state.mark_at == 128


def test_reads_sharing_a_step_give_each_its_bits_alone(runner):
    rng = np.random.default_rng(2)
    a, b = rng.integers(0, runner.vocab_size, 90), rng.integers(0, runner.vocab_size, 40)
    ta, tb = list(range(0, 2)), list(range(2, 3))
    alone_a, _ = read(runner, a, ta, [])
    alone_b, _ = read(runner, b, tb, [])
    sa, sb = fresh(runner), fresh(runner)
    logits = runner.model.forward_reads([(a, 0, ta, True), (b, 0, tb, True)], runner.kv, states=(sa, sb))
    assert np.array_equal(logits[0], alone_a) and np.array_equal(logits[1], alone_b)


def test_the_recurrent_state_is_the_request_s_own_memory(runner):
    """A decode row continues from `now`; the mark stays where the read left it."""
    ids = np.random.default_rng(3).integers(0, runner.vocab_size, 70)
    table = list(range(runner.pool.blocks_for(80)))
    _, state = read(runner, ids, table, [])
    mark = state.mark.copy()
    one = runner.decode_logits([5], [table], [70], [state])
    state.decoded()
    assert state.now_at == 71 and state.mark_at == 64 and state.mark.equals(mark) and not state.now.equals(mark)
    again, state2 = read(runner, ids, table, [])
    two = runner.decode_logits([5], [table], [70], [state2])
    assert np.array_equal(np.array(one), np.array(two))


# ---------------------------------------------------------------- the engine process

PROMPT = list(range(300, 300 + 150))
OTHER = list(range(900, 900 + 200))
SHORT = [11, 22, 33, 44, 55]
SAMPLING = {"greedy": {"temperature": 0.0, "seed": 0},
            "seeded": {"temperature": 0.9, "top_p": 0.95, "seed": 1234}}


@pytest.fixture(scope="module")
def engine(model_file):
    e = EngineProcess([PY, "-m", "engine", "--serve", "--model", str(model_file), "--device", "cpu", "--ctx", "1024",
                       "--chunk", str(CHUNK), "--max-running", "6", "--prefill-preempt-min-tokens", "0"])
    e.handshake()
    yield e
    e.close()


@pytest.mark.parametrize("sampling", SAMPLING)
def test_a_request_alone_beside_others_and_parked_gives_the_same_tokens(engine, sampling):
    params = {**SAMPLING[sampling], "reuse": 0}
    alone = sc.uninterrupted(engine, PROMPT, 8, params)
    assert len(alone.tokens) == 8
    engine.send(sc.gen(SHORT, 20, {**params, "seed": 5}, 10))  # decoding while the others read
    seen = engine.read_until(m.Token, ident=10)
    engine.send(sc.gen(OTHER, 2, params, 11))
    engine.send(sc.gen(PROMPT, 8, params, sc.A))
    done = set()
    while len(done) < 3:
        seen.append(engine.read())
        if isinstance(seen[-1], (m.Done, m.Err)):
            assert isinstance(seen[-1], m.Done), seen[-1]
            done.add(seen[-1].id)
    assert sc.tokens_of(seen, sc.A) == alone.tokens
    parked = sc.parked(engine, PROMPT, 8, params, CHUNK, [1, 2], OTHER[:70], 3)
    assert parked.tokens == alone.tokens and parked.parks == [64, 128]


def run(engine, ident: int, prompt, max_new: int, params: dict, reuse: bool) -> list[m.Message]:
    engine.send(m.Gen(max_new, tuple(prompt), {**params, "fp": 1, "reuse": int(reuse)}, ident))
    return engine.read_until(m.Done, ident=ident)


@pytest.mark.parametrize("sampling", SAMPLING)
def test_a_cached_prefix_and_the_previous_answer_are_reused_with_the_cold_tokens(engine, sampling):
    """A hybrid's prefix is reused up to the last block boundary whose recurrent state is kept: a read's
    marks (each prompt step's end), and the last whole block of an answer read again once it is done."""
    params = SAMPLING[sampling]
    tail = list(range(2000, 2030))
    answer = sc.tokens_of(run(engine, 30, PROMPT, 60, params, reuse=True), 30)
    assert len(answer) == 60
    run(engine, 31, SHORT, 1, params, reuse=False)  # read beside the answer's read again: that one is done too
    for ident, prompt, cached in ((32, PROMPT + tail, 128), (34, PROMPT + answer[:59] + tail, 192)):
        warm = run(engine, ident, prompt, 8, params, reuse=True)
        assert warm[-1].extra["cached"] == str(cached)  # 128: the prompt's marks; 192: past it, into the answer
        cold = run(engine, ident + 1, prompt, 8, params, reuse=False)
        assert sc.tokens_of(warm, ident) == sc.tokens_of(cold, ident + 1)
        assert warm[-1].extra["fp"] == cold[-1].extra["fp"]


def test_mtp_layers_counted_in_the_file_are_not_run(tmp_path):
    """A file converted with its MTP layers (llama.cpp's default) counts them in block_count and names them
    in nextn_predict_layers: the model's own layers are the others."""
    path = tmp_path / "mtp.gguf"
    subprocess.run([sys.executable, str(ROOT / "tools/fixtures/make_synthetic_gguf.py"), str(path), "--arch", "qwen35",
                    *SHAPE, "--mtp-layers", "1"], check=True, capture_output=True)
    cfg, weights, _ = load_model(str(path), cpu_backend())
    assert cfg.n_layers == 4 and len(weights.layers) == 4 and cfg.hybrid.attention_layers == [1, 3]


def test_a_continuation_after_a_restart_has_the_uninterrupted_state(engine):
    """GEN drawn=k (a request continued on a restarted engine): its k tokens go through as the decode rows they were,
    so the recurrent state and the tokens after them are the uninterrupted request's (engine/runner/sequence.py
    replay; read as prompt rows, a hybrid's state took other bits)."""
    params = {**SAMPLING["seeded"], "fp": 1, "reuse": 0}
    whole = run(engine, 60, PROMPT, 20, params, reuse=False)
    tokens = sc.tokens_of(whole, 60)
    engine.send(m.Gen(12, tuple(PROMPT) + tuple(tokens[:8]), {**params, "drawn": 8}, 61))
    rest = engine.read_until(m.Done, ident=61)
    assert sc.tokens_of(rest, 61) == tokens[8:] and rest[-1].extra["fp"] == whole[-1].extra["fp"]
