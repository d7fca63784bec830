"""Speculative decoding with a draft model (`--speculative draft --draft FILE`, engine/runner/draft_model.py)
on the real engine process and the default model: the draft only proposes, so a request's tokens and
final state are those of one-token steps whatever it proposes. The default model drafting for itself
proposes what it would pick (nearly every greedy draft kept); a random model of the same vocabulary
proposes noise (few kept), for two requests drafted in one batch; a file of another vocabulary is refused at
start; and the draft pool's blocks all come back once the requests end."""
import subprocess
import sys

import pytest

from engine.modelfile.gguf_file import GGUFFile
from engine.modelfile.model_config import field_value
from engine.modelfile.model_path import default_model_path
from engine.modelfile.tokenizer import load_tokenizer
from protocol import messages as m
from tests.harness import PY, ROOT, EngineProcess
from tools.checks import preempt_scenarios as sc

PASSAGE = "def area(width, height):\n    return width * height\n"
MAX_NEW = 12
GREEDY, SAMPLED = {"temperature": 0.0, "seed": 0}, {"temperature": 0.7, "top_p": 0.95, "seed": 3}


def engine(draft, most: int, *more: str) -> EngineProcess:
    e = EngineProcess([PY, "-m", "engine", "--serve", "--device", "cpu", "--ctx", "512", "--speculative", "draft",
                       "--draft", str(draft), "--draft-max", str(most), "--draft-row-cost", "0", *more])  # (every draft made)
    e.handshake()
    return e


@pytest.fixture(scope="module")
def rewrite() -> tuple[int, ...]:
    """A request to repeat a short passage: its answer quotes its prompt."""
    tok = load_tokenizer(str(default_model_path()))
    return tuple(tok.encode(f"<|im_start|>user\nCopy this code exactly:\n{PASSAGE}<|im_end|>\n<|im_start|>assistant\n"
                            f"{PASSAGE[:20]}"))


@pytest.fixture(scope="module")
def self_draft():
    e = engine(default_model_path(), most=8)
    yield e
    e.close()


@pytest.fixture(scope="module")
def plain(self_draft, rewrite) -> dict[str, tuple[list[int], str]]:
    """The request's tokens and final state without drafts (spec=0): what every drafted run must give."""
    runs = {"greedy": run(self_draft, 10, rewrite, GREEDY, spec=0),
            "sampled": run(self_draft, 11, rewrite, SAMPLED, spec=0)}
    return {case: (sc.tokens_of(lines, lines[-1].id), lines[-1].extra["fp"]) for case, lines in runs.items()}


def run(e: EngineProcess, ident: int, prompt, params: dict, spec: int) -> list[m.Message]:
    e.send(sc.gen(prompt, MAX_NEW, {**params, "spec": spec}, ident))
    return e.read_until(m.Done, ident=ident)


def draft_pool_is_whole(e: EngineProcess) -> bool:
    """The draft pool's free blocks, as the pool line after a new request reports them, are all of its blocks."""
    e.send(m.Gen(1, (1, 2, 3), {"spec": 0}, 99))
    pools = [x for x in e.read_until(m.Done, ident=99) if isinstance(x, m.Info) and "pool_draft_free" in x.fields]
    return pools[-1].fields["pool_draft_free"] == e.info["draft_blocks"]


@pytest.mark.parametrize("case", ["greedy", "sampled"])
def test_the_model_drafting_for_itself_changes_no_token_and_its_greedy_drafts_are_kept(self_draft, rewrite, plain,
                                                                                        case):
    drafted = run(self_draft, 1, rewrite, GREEDY if case == "greedy" else SAMPLED, spec=1)
    assert (sc.tokens_of(drafted, 1), drafted[-1].extra["fp"]) == plain[case]
    n, kept = int(drafted[-1].extra["drafted"]), int(drafted[-1].extra["accepted"])
    assert n > 0 and kept >= (0.9 * n if case == "greedy" else 1)  # (a sampled draw keeps a draft with
    # probability p(draft))
    assert self_draft.info["draft_path"] == str(default_model_path()) and draft_pool_is_whole(self_draft)


@pytest.fixture(scope="module")
def random_draft(tmp_path_factory):
    """A 1-layer random model of the default model's vocabulary (1 K/V head of 32 values)."""
    path = tmp_path_factory.mktemp("draft") / "random.gguf"
    subprocess.run([sys.executable, str(ROOT / "tools/fixtures/make_synthetic_gguf.py"), str(path), "--arch", "llama",
                    "--layers", "1", "--dim", "64", "--ffn", "128", "--heads", "2", "--kv-heads", "1", "--head-dim", "32",
                    "--ctx", "512", "--type", "F32"], check=True, capture_output=True)
    return path


def test_a_random_draft_changes_no_token_of_two_requests_drafted_together(random_draft, rewrite, plain):
    path = random_draft
    ours, theirs = GGUFFile(str(default_model_path())), GGUFFile(str(path))
    assert field_value(theirs, "tokenizer.ggml.tokens") == field_value(ours, "tokenizer.ggml.tokens")
    e = engine(path, most=3)  # (a rejected draft's row costs a decode row: few of them)
    try:
        e.send(sc.gen(rewrite, MAX_NEW, {**GREEDY, "spec": 1}, 1))
        e.send(sc.gen(rewrite, MAX_NEW, {**SAMPLED, "spec": 1}, 2))
        seen, done = [], {}
        while len(done) < 2:
            seen.append(e.read())
            if isinstance(seen[-1], m.Done):
                done[seen[-1].id] = seen[-1]
        assert (sc.tokens_of(seen, 1), done[1].extra["fp"]) == plain["greedy"]
        assert (sc.tokens_of(seen, 2), done[2].extra["fp"]) == plain["sampled"]
        for d in done.values():
            assert 0 < int(d.extra["drafted"]) and int(d.extra["accepted"]) <= int(d.extra["drafted"]) // 4
        assert draft_pool_is_whole(e)
    finally:
        e.close()


def test_the_draft_pool_takes_the_target_s_cache_type(random_draft, rewrite):
    """--kv-type q8_0: the draft's rows are q8_0 too (34 bytes a 32 values: a block of 64 positions of one layer's
    one K/V head of 32 values is 2 x 64 x 34 bytes), and the target's tokens are still its own."""
    e = engine(random_draft, 3, "--kv-type", "q8_0")
    try:
        assert e.info["kv_type"] == "q8_0" and int(e.info["draft_block_bytes"]) == 2 * 64 * 34
        alone, drafted = (run(e, i, rewrite, GREEDY, spec=spec) for i, spec in ((1, 0), (2, 1)))
        assert sc.tokens_of(drafted, 2) == sc.tokens_of(alone, 1) and int(drafted[-1].extra["drafted"]) > 0
        assert drafted[-1].extra["fp"] == alone[-1].extra["fp"] and draft_pool_is_whole(e)
    finally:
        e.close()


def test_a_draft_of_another_vocabulary_or_none_is_refused_at_start():
    other = ROOT / "tests/fixtures/embedding/qwen3-embedding.gguf"
    e = EngineProcess([PY, "-m", "engine", "--serve", "--device", "cpu", "--speculative", "draft", "--draft",
                       str(other)])
    with pytest.raises(EOFError):
        e.handshake()
    assert e.close() == m.START_REFUSED and "its vocabulary is not the target's" in "".join(e.stderr)
    missing = subprocess.run([PY, "-m", "engine", "--serve", "--speculative", "draft"], cwd=ROOT, capture_output=True,
                             text=True)
    assert missing.returncode == 2 and "--speculative draft takes its draft model from --draft FILE" in missing.stderr
