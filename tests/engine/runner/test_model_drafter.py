"""The draft model's pool and per-request state (engine/runner/draft_model.py) on a tiny random model of
the default model's vocabulary: a request's rows are caught up and drafted in its own blocks, the
pool's free blocks all come back when it is released, one that cannot have blocks gets no drafts (no
error), and the rows of kept drafts are not read again; and the same on the GPU's backend (its kernels run on the
host), as a GPU target's draft runs."""
import subprocess
import sys

import pytest

from engine.model.weights import load_model
from engine.ops.backend import cpu_backend
from engine.runner.draft_model import DraftModel
from engine.runner.sampler import Sampler, SamplingParams
from engine.runner.sequence import Sequence
from tests.engine.kernels.host_gpu import host_gpu_model
from tests.harness import ROOT

BLOCK, CHUNK = 16, 32
FREE = 0.0  # a drafted row's cost: free, so every draft is as long as its most (the pace is draft_pace's tests')


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("draft") / "draft.gguf"
    subprocess.run([sys.executable, str(ROOT / "tools/fixtures/make_synthetic_gguf.py"), str(path), "--layers", "1",
                    "--dim", "64", "--ffn", "128", "--heads", "2", "--kv-heads", "1", "--head-dim", "32", "--ctx", "512",
                    "--type", "F32"], check=True, capture_output=True)
    backend = cpu_backend()
    cfg, weights, _ = load_model(str(path), backend)
    return str(path), cfg, weights, backend


def draft_model(tiny, blocks: int) -> DraftModel:
    path, cfg, weights, backend = tiny
    return DraftModel(path, cfg, weights, backend, ctx=256, chunk=CHUNK, block_size=BLOCK, positions=blocks * BLOCK,
                      tokens=cfg.vocab_size)


def decoding(model: DraftModel, prompt: list[int], most: int = 4) -> Sequence:
    """A request after its first token (drawn right after its prompt), with a drafter of `model`'s."""
    seq = Sequence(id=1, prompt=tuple(prompt), max_new=64, sampler=Sampler(SamplingParams(), prompt),
                   stop_ids=frozenset(), drafter=model.drafter(prompt, most))
    seq.pos = len(prompt)
    seq.generated.append(7)
    seq.drafter.extend([7])
    return seq


def test_drafts_come_from_the_requests_own_rows_and_its_blocks_all_come_back(tiny):
    model = draft_model(tiny, blocks=12)
    a, b = decoding(model, list(range(100, 140))), decoding(model, list(range(200, 250)))
    model.propose([a, b], FREE)  # a's 40 rows read in two chunks (one a step): no drafts for it this step
    assert a.drafter.propose(FREE) == [] and a.drafter.filled == CHUNK and b.drafter.filled == CHUNK
    model.propose([a, b], FREE)
    drafts = a.drafter.propose(FREE)
    assert len(drafts) == 4 and len(b.drafter.propose(FREE)) == 4 and a.drafter.filled == 41  # prompt + its token
    assert len(a.drafter.table) == model.kv.blocks_for(40 + 4)  # rows up to the last draft's input
    assert len(model.free) == 12 - len(a.drafter.table) - len(b.drafter.table)
    alone = decoding(model, list(range(100, 140)))  # the same context alone: the same drafts
    model.propose([alone], FREE)
    model.propose([alone], FREE)
    assert alone.drafter.propose(FREE) == drafts
    for seq in (a, b, alone):
        seq.drafter.release()
    assert sorted(model.free) == list(range(12)) and a.drafter.filled == 0


def test_a_request_whose_blocks_cannot_be_had_gets_no_drafts(tiny):
    model = draft_model(tiny, blocks=2)
    first, second = decoding(model, list(range(300, 320))), decoding(model, list(range(400, 420)))
    model.propose([first, second], FREE)  # first takes both blocks (20 rows and 4 drafts' rows: 2 blocks)
    assert len(first.drafter.propose(FREE)) == 4 and second.drafter.propose(FREE) == [] and model.free == []
    first.drafter.release()
    model.propose([second], FREE)
    assert len(second.drafter.propose(FREE)) == 4


def test_the_rows_of_kept_drafts_are_not_read_again(tiny):
    model = draft_model(tiny, blocks=8)
    seq = decoding(model, list(range(500, 530)))
    model.propose([seq], FREE)
    drafts = seq.drafter.propose(FREE)
    seq.drafter.verified(len(drafts), 2)  # two kept, then the model's own token
    assert seq.drafter.filled == 31 + 2  # the newest token's row and the two kept drafts'
    seq.drafter.extend([*drafts[:2], 9])
    seq.generated += [*drafts[:2], 9]
    reads, forward = [], model.model.forward
    model.model.forward = lambda tokens, start, *args, **kw: reads.append((start, len(tokens))) or forward(
        tokens, start, *args, **kw)
    model.propose([seq], FREE)
    assert reads == [] and seq.drafter.filled == 34  # nothing read again: the draft steps go on from the new token
    assert len(seq.drafter.propose(FREE)) == 4


def test_on_the_gpu_backend_a_request_s_drafts_are_its_own_and_the_pool_comes_back(tmp_path):
    """The draft model on the GPU's backend (host_gpu.py: its kernels run on the CPU), as `--speculative draft` runs
    it beside a GPU target: a small Llama in Q8_0 caught up and drafting for two requests in one batch, each
    request's drafts those it gets alone (a decode row's bits do not depend on the batch), its blocks all back."""
    path = tmp_path / "draft.gguf"
    subprocess.run([sys.executable, str(ROOT / "tools/fixtures/make_synthetic_gguf.py"), str(path), "--layers", "2",
                    "--dim", "128", "--ffn", "256", "--heads", "2", "--kv-heads", "1", "--ctx", "512", "--tied",
                    "--type", "Q8_0", "--tokenizer", str(ROOT / "tests/fixtures/hybrid/qwen3next.gguf")],
                   check=True, capture_output=True)
    backend, cfg, weights = host_gpu_model(path, tmp_path)
    model = DraftModel(str(path), cfg, weights, backend, ctx=256, chunk=CHUNK, block_size=BLOCK,
                       positions=12 * BLOCK, tokens=cfg.vocab_size)
    a, b = decoding(model, list(range(100, 130))), decoding(model, list(range(200, 220)))
    model.propose([a, b], FREE)
    together = [a.drafter.propose(FREE), b.drafter.propose(FREE)]
    assert all(len(d) == 4 for d in together)
    for seq in (a, b):
        seq.drafter.release()
    alone = [decoding(model, list(range(100, 130))), decoding(model, list(range(200, 220)))]
    for seq in alone:
        model.propose([seq], FREE)
    assert [seq.drafter.propose(FREE) for seq in alone] == together
    for seq in alone:
        seq.drafter.release()
    assert sorted(model.free) == list(range(12))
