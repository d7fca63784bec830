"""Rows a decode graph computes anyway (its batch size's, the rest padding: engine/runner/decode_graph.py) go to
longer n-gram drafts (engine/loop/decode_steps.py fill_spare_rows): the likeliest first, within each request's
room and the pool's free blocks, never past one forward's rows or for a long context, and nothing without
graphs."""
from __future__ import annotations

from types import SimpleNamespace

from engine.loop.decode_steps import FREE_ROW_KEYS, DecodeSteps
from engine.loop.step_trace import StepTrace
from engine.runner.decode_graph import padded_rows
from engine.runner.ngram_draft import NgramDrafter
from engine.runner.sampler import Sampler, SamplingParams
from engine.runner.sequence import Sequence

TEXT = list(range(100, 160))  # a passage the answer copies: every lookup finds what followed


def copying(most: int = 8, drafted: int = 0, kept: int = 0) -> Sequence:
    """A request whose answer copies TEXT (it has started to), its drafts the first `drafted` of the lookup, its
    record `kept` drafts of `most` all kept (a likelier one)."""
    prompt = tuple(TEXT + TEXT[:4])
    seq = Sequence(id=1, prompt=prompt, max_new=100, sampler=Sampler(SamplingParams(), prompt), stop_ids=frozenset(),
                   pos=len(prompt), generated=[TEXT[4]])
    seq.drafter = NgramDrafter(prompt + (TEXT[4],), most)
    for _ in range(kept):
        seq.drafter.observe(most, most)
    seq.drafts = seq.drafter.lookup(most)[:drafted]
    return seq


def steps(graphs: bool = True, free: bool = True, max_batch: int = 64) -> DecodeSteps:
    runner = SimpleNamespace(row_cost=None, max_batch=max_batch, ctx=4096,
                             decoder=SimpleNamespace(size=padded_rows) if graphs else None)
    memory = SimpleNamespace(grow_from_free=lambda seq, positions: free)
    return DecodeSteps(runner, memory, None, lambda line: None, StepTrace(enabled=False))


def test_a_lone_requests_draft_fills_its_graphs_rows():
    seq = copying(drafted=4)  # 5 rows: the graph of 8 computes 3 more
    steps().fill_spare_rows([seq])
    assert seq.drafts == TEXT[5:12] and 1 + len(seq.drafts) == padded_rows(5)


def test_the_spare_rows_go_to_the_likeliest_drafts_first():
    doubtful, likely = copying(drafted=0), copying(drafted=0, kept=3)
    steps().fill_spare_rows([doubtful, likely, copying(drafted=1)])  # 4 rows: none spare
    assert doubtful.drafts == [] and likely.drafts == []
    rest = copying(drafted=2)  # 1 + 1 + 3 = 5 rows: the graph of 8 has 3 spare
    steps().fill_spare_rows([doubtful, likely, rest])
    assert likely.drafts == TEXT[5:8] and doubtful.drafts == [] and rest.drafts == TEXT[5:7]


def test_nothing_is_filled_without_graphs_free_blocks_or_room():
    for steps_, seq in ((steps(graphs=False), copying(drafted=4)), (steps(free=False), copying(drafted=4)),
                        (steps(max_batch=4), copying(drafted=4))):
        steps_.fill_spare_rows([seq])
        assert seq.drafts == TEXT[5:9]
    deep = copying(drafted=4)
    deep.pos = FREE_ROW_KEYS + 1  # a long context: a row's attention is not free
    steps().fill_spare_rows([deep])
    assert deep.drafts == TEXT[5:9]
    near_end = copying(drafted=4)
    near_end.max_new = 6  # one generated: five more, its newest's row and four drafts
    steps().fill_spare_rows([near_end])
    assert near_end.drafts == TEXT[5:10]
