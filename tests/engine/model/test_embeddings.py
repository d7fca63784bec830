"""Embeddings (GEN embed=1, engine/runner/pooling.py) on the real engine process against an independent
reference: a tiny random Qwen3 made with transformers and converted by llama.cpp's converter as an
embedding model (its file says qwen3.pooling_type = last, as Qwen3-Embedding's do), and the vectors
transformers pools from its last_hidden_state (tools/fixtures/make_embedding_fixture.py says how). Each
pooling's vectors match transformers read in chunks of 16 rows (pieces that cut mean's blocks), and are
the same bits in steps shared with other reads and a decoder (cut elsewhere), and parked and resumed."""
import hashlib
import json
import subprocess
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from engine.modelfile.gguf_file import GGUFFile
from engine.modelfile.tokenizer import GGUFTokenizer
from engine.runner.pooling import embed_refusal
from protocol import messages as m
from tests.harness import PY, ROOT, EngineProcess

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures/embedding"
GOLDEN = json.loads((FIXTURES / "embedding_golden.json").read_text())
MODEL = FIXTURES / GOLDEN["file"]
# float32 both, sums in other orders: the largest difference measured was 6.9e-6 (values up to ~3.1, the
# last row's) and 2.1e-6 for mean and cls, the same at --chunk 16 and 256
TOL = dict(rtol=0, atol=3e-5)


@pytest.fixture(scope="module", params=["last", "mean", "cls"])
def engine(request):
    assert hashlib.sha256(MODEL.read_bytes()).hexdigest() == GOLDEN["sha256"], "the fixture's file changed"
    flags = [] if request.param == "last" else ["--pooling", request.param]  # last: as the file says
    e = EngineProcess([PY, "-m", "engine", "--serve", "--device", "cpu", "--model", str(MODEL), "--ctx", "512",
                       "--chunk", "16", "--step-tokens", "24", "--max-running", "8",
                       "--prefill-preempt-min-tokens", "0", *flags])
    e.handshake()
    assert e.info["pooling"] == request.param and e.info["dim"] == "128"
    yield request.param, e
    e.close()


def embed(engine, ident: int, ids, reuse: int = 0) -> m.Gen:
    return m.Gen(1, tuple(ids), {"embed": 1, "reuse": reuse}, ident)


def vector_of(lines, ident: int) -> np.ndarray:
    done = next(x for x in lines if isinstance(x, m.Done) and x.id == ident)
    assert (done.generated, done.finish) == (0, "stop")
    assert not any(isinstance(x, m.Token) and x.id == ident for x in lines)
    return np.array(next(x.vector for x in lines if isinstance(x, m.Embedding) and x.id == ident), dtype=np.float32)


def alone(e, ids, ident: int = 1) -> np.ndarray:
    e.send(embed(e, ident, ids))
    return vector_of(e.read_until(m.Done, ident=ident), ident)


def test_vectors_match_transformers_and_do_not_depend_on_the_requests_beside(engine):
    pooling, e = engine
    vectors = [alone(e, case["ids"]) for case in GOLDEN["cases"]]
    for case, vector in zip(GOLDEN["cases"], vectors):
        np.testing.assert_allclose(vector, case[pooling], **TOL, err_msg=f"{pooling}, {len(case['ids'])} tokens")
    # all at once behind another request's long read, then beside its decoding: the reads behind the first
    # take 8 rows a step (--step-tokens 24 over chunks of 16), their pieces cut elsewhere than alone
    e.send(m.Gen(30, tuple(range(1000, 1200)), {"temperature": 0.0, "reuse": 0}, 50))
    for i, case in reversed(list(enumerate(GOLDEN["cases"]))):
        e.send(embed(e, 10 + i, case["ids"]))
    seen = []
    for ident in (50, *range(10, 10 + len(vectors))):
        if not any(isinstance(x, m.Done) and x.id == ident for x in seen):
            seen += e.read_until(m.Done, ident=ident)
    shared = [vector_of(seen, 10 + i) for i in range(len(vectors))]
    # the same bits: each row is the same in any step where shape_free (else reads take a step each, at the
    # same absolute chunks), and mean sums whole blocks of 64 positions however the steps cut them
    assert all(np.array_equal(a, b) for a, b in zip(vectors, shared))


def test_a_parked_and_resumed_read_gives_the_same_vector(engine):
    pooling, e = engine
    ids = GOLDEN["cases"][-1]["ids"]  # 200 tokens: 13 chunks
    want = alone(e, ids)
    e.send(embed(e, 1, ids))
    seen = e.read_until(m.PromptProgress, ident=1)
    e.send(m.Yield())
    seen += e.read_until(m.Suspended, ident=1)
    e.send(m.Gen(2, (9, 8, 7, 6), {"temperature": 0.0}, 2))  # another request while it is parked
    e.read_until(m.Done, ident=2)
    e.send(m.Resume(1))
    seen += e.read_until(m.Done, ident=1)
    assert np.array_equal(vector_of(seen, 1), want)
    if pooling == "last":  # a cached prefix may be reused: the last row is read whatever
        e.send(embed(e, 3, ids, reuse=1))
        seen = e.read_until(m.Done, ident=3)
        assert int(next(x for x in seen if isinstance(x, m.Info) and x.id == 3).fields["cached"]) > 0
        np.testing.assert_allclose(vector_of(seen, 3), want, **TOL)
    else:  # mean and cls need every row from position 0: no prefix
        e.send(embed(e, 3, ids, reuse=1))
        seen = e.read_until(m.Done, ident=3)
        assert next(x for x in seen if isinstance(x, m.Info) and x.id == 3).fields["cached"] == "0"
        assert np.array_equal(vector_of(seen, 3), want)


def test_engines_that_cannot_pool_refuse_embeddings_clearly():
    unset = embed_refusal(SimpleNamespace(pooling="unset", recurrent=None))
    assert "names no pooling" in unset and "--pooling mean|cls|last" in unset
    assert "'rank'" in embed_refusal(SimpleNamespace(pooling="rank", recurrent=None))
    assert "hybrid" in embed_refusal(SimpleNamespace(pooling="last", recurrent=object()))
    assert embed_refusal(SimpleNamespace(pooling="mean", recurrent=None)) is None
    bad = subprocess.run([PY, "-m", "engine", "--serve", "--pooling", "max"], cwd=ROOT, capture_output=True, text=True)
    assert bad.returncode == 2 and "--pooling: invalid choice: 'max'" in bad.stderr


def test_the_file_says_its_inputs_end_with_eos():
    """Qwen3-Embedding's files set tokenizer.ggml.add_eos_token, as this one does: the server appends eos to
    an embedding's text (serve/http/embeddings_api.py)."""
    special = GGUFTokenizer(GGUFFile(str(MODEL), "r")).special
    assert special.add_eos and special.eos == 2
