"""A request's logits leaving the decode graph's output buffer before they are drawn from (engine/runner/picks.py
Picks.set_aside: paused for memory, or in an earlier forward of a step of several): a plain greedy row's token taken
from the replay's argmax then (what its draw would return), the logits copied only where something still reads
them. A stand-in for the decode graphs gives the argmax (on a GPU the 256-client ladder holds the texts to their
solo runs: tools/device/pending_round.sh ladder)."""
import numpy as np

from engine.ops.backend import cpu_backend
from engine.runner.picks import Picks
from engine.runner.sampler import Sampler, SamplingParams
from engine.runner.sequence import Sequence


class Graphs:
    """The decode graphs' surface set_aside reads: the latest replay's argmax of a row."""
    def __init__(self, argmax: list[int]):
        self.argmax, self.asked = argmax, []

    def greedy_token(self, row: int) -> int:
        self.asked.append(row)
        return self.argmax[row]


def in_graph(row: int, logprobs: int | None = None, **params) -> Sequence:
    seq = Sequence(id=row, prompt=(1, 2), max_new=8, sampler=Sampler(SamplingParams(**params), (1, 2)),
                   stop_ids=frozenset(), logprobs=logprobs)
    seq.logits, seq.graph_row = np.arange(8, dtype=np.float32) + row, row  # (a row of the graph's buffer)
    return seq


def picks_over(graphs: Graphs) -> Picks:
    picks = Picks(cpu_backend(), None, 8)
    picks.decoder = graphs
    return picks


def test_a_greedy_row_keeps_the_replays_argmax_and_lets_its_logits_go():
    picks = picks_over(Graphs([5, 3, 7]))
    seq = in_graph(1)
    picks.set_aside(seq)
    assert (seq.picked, seq.logits, seq.graph_row) == (3, None, None)
    assert picks.sample(seq) == 3 and seq.picked is None


def test_logits_are_copied_where_something_still_reads_them():
    graphs = Graphs([5, 3, 7])
    picks = picks_over(graphs)
    scored = in_graph(2, logprobs=2)  # greedy, asking log-probabilities: the token known, the logits still read
    undrawn = in_graph(0, temperature=0.8, seed=1)  # sampled, not drawn behind its forward: drawn from them later
    drafted = in_graph(1)  # greedy with drafts' rows after it: the drafts' logits are read in turn
    drafted.draft_logits = [np.ones(8, dtype=np.float32)]
    rows = {id(s): s.logits for s in (scored, undrawn, drafted)}
    for seq in (scored, undrawn, drafted):
        picks.set_aside(seq)
        assert seq.graph_row is None and seq.logits is not rows[id(seq)]
        assert np.array_equal(seq.logits, rows[id(seq)])
    assert (scored.picked, undrawn.picked, drafted.picked) == (7, None, None)
    assert drafted.draft_logits[0] is not None and graphs.asked == [2]


def test_a_row_drawn_behind_its_forward_lets_its_logits_go():
    seq = in_graph(0, temperature=0.8, seed=1)
    seq.picked = 42
    picks_over(Graphs([5])).set_aside(seq)
    assert (seq.picked, seq.logits) == (42, None)


def test_a_request_paused_after_its_draw_takes_no_token_from_the_spent_logits():
    """Paused for memory after its token was drawn (unstepped): the replay's argmax is the token just drawn, not
    its next; it goes to its forward first, as before."""
    graphs = Graphs([5, 3])
    seq = in_graph(1)
    seq.unstepped = True
    picks_over(graphs).set_aside(seq)
    assert seq.picked is None and graphs.asked == [] and seq.logits is not None and seq.graph_row is None
