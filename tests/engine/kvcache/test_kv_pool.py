"""Several requests over one pool of KV blocks, through the engine loop over its pipes (mock model,
real loop and real block pool): decode steps shared, reads between them for about the decode interval,
admission by memory (DEFER, never an error), parks that keep their blocks, moves to host memory
and pauses when memory runs short, the prefix cache across finished, running and parked requests."""
import time

from protocol import messages as m
from protocol.codec import verb


def gen(n_prompt: int, ident: int, max_new: int = 4, first: int = 10, **params) -> m.Gen:
    return m.Gen(max_new, tuple(range(first, first + n_prompt)), params, ident)


def start(engine_factory, *args):
    e = engine_factory("--chunk", "4", "--chunk-s", "0.02", "--token-s", "0.02", "--prefill-preempt", *args,
                       mock=True)
    e.handshake()
    return e


def lines_until_done(e, idents: set[int]) -> list[m.Message]:
    seen, left = [], set(idents)
    while left:
        msg = e.read()
        seen.append(msg)
        assert not isinstance(msg, m.Err), msg
        if isinstance(msg, m.Done):
            left.discard(msg.id)
    return seen


def test_requests_decode_together_and_a_read_runs_between_their_steps(engine_factory):
    e = start(engine_factory, "--max-running", "3")
    assert e.info["max_running"] == "3" and e.info["kv_block"] == "4"
    e.send(gen(4, 1, max_new=30))
    e.send(gen(4, 2, max_new=30, first=50))
    seen = e.read_until(m.Token, ident=2)
    e.send(gen(40, 3, max_new=2, first=90))  # a read of 10 chunks while 1 and 2 decode
    seen += lines_until_done(e, {1, 2, 3})
    held = {x.id: int(x.fields["blocks"]) for x in seen if isinstance(x, m.Info) and "blocks" in x.fields}
    assert held == {1: 1, 2: 1, 3: 1}  # a request is given the blocks of its first chunk only
    order = [(verb(x), x.id) for x in seen if isinstance(x, (m.Token, m.PromptProgress))]
    steps = [i for i, item in enumerate(order) if item == ("T", 1)]
    reads_between = [order[i + 1 : j].count(("PP", 3)) for i, j in zip(steps, steps[1:])]
    # a round reads while the decoders have waited less than --decode-interval-ms (40): chunks of 20 ms,
    # so one or two between two steps, never three; and 2 steps beside 1 every time
    assert max(reads_between) in (1, 2) and sum(reads_between) == 10, reads_between
    # once 2 has its first token (1 may step alone before 2's GEN is read on a loaded machine), 2 steps beside
    # 1: a step of 1 alone or of 2 twice between two of 1's is at most one (a read's pause on a loaded machine)
    together = [i for i in steps if i > order.index(("T", 2))]
    apart = [order[i + 1 : j].count(("T", 2)) for i, j in zip(together, together[1:])]
    assert sum(n != 1 for n in apart) <= 1, apart
    tokens = {i: [x.token for x in seen if isinstance(x, m.Token) and x.id == i] for i in (1, 2)}
    assert tokens[1][:4] == [10, 11, 12, 13] and tokens[2][:4] == [50, 51, 52, 53]  # each its own answer


def test_a_step_of_several_takes_one_steps_time(engine_factory):
    """The mock's decode step costs one token's time whatever the batch: four requests of 25 tokens
    together take about what one takes, not four times as long."""
    e = start(engine_factory, "--max-running", "4", "--token-s", "0.04")
    began = time.monotonic()
    for i in range(1, 5):
        e.send(gen(4, i, max_new=25, first=10 * i))
    lines_until_done(e, {1, 2, 3, 4})
    assert time.monotonic() - began < 25 * 0.04 * 2.5


def test_past_the_cap_a_gen_is_deferred_not_lost(engine_factory):
    e = start(engine_factory, "--max-running", "2")
    e.send(gen(4, 1, max_new=50))
    e.send(gen(4, 2, max_new=50))
    e.send(gen(4, 3))
    assert e.read_until(m.Defer, ident=3)[-1].reason == "busy"
    e.send(m.Stop(1))
    e.read_until(m.Done, ident=1)
    e.send(gen(4, 3))  # room again
    assert e.read_until(m.Done, ident=3)[-1].finish == "length"


def test_a_gen_whose_blocks_cannot_be_had_is_deferred_then_taken(engine_factory):
    """A pool of 8 blocks of 4: a request reading 24 tokens holds 6 and then 7 while it decodes; a
    second one's first chunk would need one more than the pool has left, so it is deferred, and
    taken once the first has ended. The others are sent after the first's second token: its first is
    drawn right after its prompt, before the step that takes its seventh block, so lines arriving then
    (a loaded machine: the test answered before the engine's next round) could have the block first.
    Tokens of half a second leave the others time to arrive while it decodes."""
    e = start(engine_factory, "--max-running", "4", "--kv-tokens", "32", "--no-prompt-reuse", "--token-s", "0.5")
    e.send(gen(24, 1, max_new=6))
    e.read_until(m.Token, ident=1)
    e.read_until(m.Token, ident=1)  # its seventh block is held
    e.send(gen(4, 2, first=500))
    e.send(gen(12, 3, first=600))  # 3 blocks: only one is left
    seen = e.read_until(m.Defer, ident=3)
    assert seen[-1].reason == "memory"
    assert not [x for x in seen if isinstance(x, m.Defer) and x.id == 2]  # one block was free for it
    lines_until_done(e, {1, 2})
    e.send(gen(12, 3, first=600))
    assert e.read_until(m.Done, ident=3)[-1].finish == "length"


def test_parks_keep_their_blocks_and_several_can_be_parked(engine_factory):
    e = start(engine_factory, "--max-running", "3")
    for ident in (1, 2):
        e.send(gen(60, ident, first=10 * ident))
        e.read_until(m.PromptProgress, ident=ident)
        e.send(m.Yield(ident))
        e.read_until(m.Suspended, ident=ident)
    e.send(gen(8, 3, first=500))  # memory to spare: nothing moves
    assert e.read_until(m.Done, ident=3)[-1].finish == "length"
    for ident in (1, 2):
        e.send(m.Resume(ident))
    seen = lines_until_done(e, {1, 2})
    dones = {x.id: x for x in seen if isinstance(x, m.Done)}
    assert all(d.extra["parks"] == "1" and float(d.extra["park_ms"]) == 0.0 for d in dones.values())  # no copy


def test_short_memory_moves_the_parked_read_to_host_memory_and_back_unchanged(engine_factory):
    e = start(engine_factory, "--max-running", "2", "--kv-tokens", "64", "--no-prompt-reuse")
    e.send(gen(60, 1, fp=1))
    e.read_until(m.PromptProgress, ident=1)
    e.read_until(m.PromptProgress, ident=1)
    e.send(m.Yield(1))
    park_fp = next(x for x in e.read_until(m.Suspended, ident=1) if isinstance(x, m.Fingerprint)).digest
    e.send(gen(56, 2, first=500))  # 14 blocks: the parked read's must go
    seen = e.read_until(m.Done, ident=2)
    assert any(isinstance(x, m.Info) and x.id == 1 and x.fields.get("host") == "1" for x in seen)
    e.send(m.Resume(1))
    resumed = e.read_until(m.Fingerprint, ident=1)[-1]
    assert resumed.digest == park_fp  # brought back exactly
    done = e.read_until(m.Done, ident=1)[-1]
    assert done.finish == "length" and float(done.extra["park_ms"]) >= 0.0


def test_short_memory_pauses_the_newest_decoder_and_brings_it_back_first(engine_factory):
    """Two requests decode in a pool that cannot hold both answers: the newer one is paused into
    host memory when the older needs a block, and comes back when the older ends; both answers are
    whole and exactly what each gives alone (the mock's answer is its prompt, echoed)."""
    e = start(engine_factory, "--max-running", "2", "--kv-tokens", "40", "--no-prompt-reuse")
    e.send(gen(8, 1, max_new=24))
    e.send(gen(8, 2, max_new=24, first=100))
    seen = lines_until_done(e, {1, 2})
    pauses = [x for x in seen if isinstance(x, m.Info) and "paused" in x.fields and x.id is not None]
    assert [(x.id, x.fields["paused"]) for x in pauses][:2] == [(2, "1"), (2, "0")]
    tokens = {i: [x.token for x in seen if isinstance(x, m.Token) and x.id == i] for i in (1, 2)}
    assert tokens[1] == [10 + i % 8 for i in range(24)] and tokens[2] == [100 + i % 8 for i in range(24)]


def test_the_prefix_cache_serves_finished_running_and_parked_requests(engine_factory):
    e = start(engine_factory, "--max-running", "4")
    first = gen(30, 1)
    e.send(first)
    assert e.read_until(m.Done, ident=1)[-1].extra["cached"] == "0"
    longer = m.Gen(4, first.tokens + (7, 7, 7, 7, 7), {}, 2)  # the next turn: the history, then more
    e.send(longer)
    seen = e.read_until(m.Done, ident=2)
    info = next(x for x in seen if isinstance(x, m.Info) and x.id == 2)
    assert info.fields["cached"] == "28"  # 30 cached, rounded down to the chunk of 4
    assert [x.done for x in seen if isinstance(x, m.PromptProgress)][0] == 32  # reading went on from 28
    assert seen[-1].extra["cached"] == "28"
    e.send(m.Gen(4, first.tokens, {"reuse": 0}, 3))  # reuse=0: read from the start
    assert e.read_until(m.Done, ident=3)[-1].extra["cached"] == "0"
    # a request still decoding shares its prompt's whole chunks
    e.send(gen(40, 4, max_new=200, first=300))
    e.read_until(m.Token, ident=4)
    e.send(gen(44, 5, first=300))
    assert next(x for x in e.read_until(m.Done, ident=5) if isinstance(x, m.Info) and x.id == 5).fields["cached"] == "40"
    e.send(m.Stop(4))
    e.read_until(m.Done, ident=4)
    # and so does a parked read, for what it has read
    e.send(gen(80, 6, first=1000))
    e.read_until(m.PromptProgress, ident=6)
    e.read_until(m.PromptProgress, ident=6)
    e.send(m.Yield(6))
    done = e.read_until(m.Suspended, ident=6)[-1].done
    e.send(gen(90, 7, first=1000))
    got = int(next(x for x in e.read_until(m.Done, ident=7) if isinstance(x, m.Info) and x.id == 7).fields["cached"])
    assert got == done and got > 0
    e.send(m.Resume(6))
    assert e.read_until(m.Done, ident=6)[-1].finish == "length"


def test_without_prompt_reuse_nothing_is_kept(engine_factory):
    e = start(engine_factory, "--max-running", "2", "--no-prompt-reuse")
    e.send(gen(30, 1))
    e.read_until(m.Done, ident=1)
    e.send(gen(30, 2))
    assert e.read_until(m.Done, ident=2)[-1].extra["cached"] == "0"


def test_a_long_chunk_pauses_between_layers_for_the_decoding_requests(engine_factory):
    """A chunk of 0.32 s in 8 layers, decoding requests wanting a step every 50 ms: the chunk pauses
    every layer (8 x 40 ms); a decoder gets several tokens between two of the read's PPs, not one.
    With --decode-interval-ms 0, one token per chunk, as before."""
    def tokens_between_reads(*args: str) -> list[int]:
        e = start(engine_factory, "--max-running", "2", "--chunk-s", "0.32", "--layers", "8", "--token-s", "0.005", *args)
        e.send(gen(4, 1, max_new=200))
        e.read_until(m.Token, ident=1)
        e.send(gen(16, 2, max_new=1, first=90))  # four chunks
        seen = e.read_until(m.Done, ident=2)
        e.send(m.Stop(1))
        assert float(seen[-1].extra["shared_ms"]) > 0  # the read waited for the decoder's steps
        order = [(verb(x), x.id) for x in seen if isinstance(x, (m.Token, m.PromptProgress))]
        reads = [i for i, (kind, ident) in enumerate(order) if kind == "PP" and ident == 2]
        return [sum(1 for kind, ident in order[i + 1 : j] if (kind, ident) == ("T", 1)) for i, j in zip(reads, reads[1:])]

    paused = tokens_between_reads("--decode-interval-ms", "50")
    assert paused and all(n >= 5 for n in paused)  # the first chunk sets the estimate: the others pause
    assert tokens_between_reads("--decode-interval-ms", "0") == [1, 1, 1]
