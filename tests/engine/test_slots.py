"""Several requests in the engine's slots, through the engine loop over its pipes (mock model, real
loop): decode steps shared, reads one chunk at a time between them, parks that stay in place,
moves to host memory when the slots run out, prompt reuse at chunk boundaries."""
import time

from protocol import messages as m


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
    e = start(engine_factory, "--slots", "3")
    assert e.info["slots"] == "3"
    e.send(gen(4, 1, max_new=30))
    e.send(gen(4, 2, max_new=30, first=50))
    seen = e.read_until(m.T, ident=2)
    e.send(gen(40, 3, max_new=2, first=90))  # a read of 10 chunks while 1 and 2 decode
    seen += lines_until_done(e, {1, 2, 3})
    slots = [x.fields["slot"] for x in seen if isinstance(x, m.Info)]
    assert sorted(slots) == ["0", "1", "2"]  # each in its own slot
    order = [(type(x).__name__, x.id) for x in seen if isinstance(x, (m.T, m.PP))]
    reads = [i for i, (kind, ident) in enumerate(order) if kind == "PP" and ident == 3]
    between = [order[i + 1 : j] for i, j in zip(reads, reads[1:])]
    assert all(("T", 1) in part and ("T", 2) in part for part in between[:5])  # decoding never waited
    tokens = {i: [x.token for x in seen if isinstance(x, m.T) and x.id == i] for i in (1, 2)}
    assert tokens[1][:4] == [10, 11, 12, 13] and tokens[2][:4] == [50, 51, 52, 53]  # each its own answer


def test_a_step_of_several_takes_one_steps_time(engine_factory):
    """The mock's decode step costs one token's time whatever the batch: four requests of 25 tokens
    together take about what one takes, not four times as long."""
    e = start(engine_factory, "--slots", "4", "--token-s", "0.04")
    began = time.monotonic()
    for i in range(1, 5):
        e.send(gen(4, i, max_new=25, first=10 * i))
    lines_until_done(e, {1, 2, 3, 4})
    assert time.monotonic() - began < 25 * 0.04 * 2.5


def test_more_requests_than_slots_get_busy_errors_not_lost_ones(engine_factory):
    e = start(engine_factory, "--slots", "2")
    e.send(gen(4, 1, max_new=50))
    e.send(gen(4, 2, max_new=50))
    e.send(gen(4, 3))
    err = e.read_until(m.Err, ident=3)[-1]
    assert "busy: all 2 slots are in use" in err.message
    e.send(m.Stop(1))
    e.read_until(m.Done, ident=1)
    e.send(gen(4, 3))  # a slot is free again
    assert e.read_until(m.Done, ident=3)[-1].finish == "length"


def test_parks_stay_in_place_and_several_can_be_parked(engine_factory):
    e = start(engine_factory, "--slots", "3")
    for ident in (1, 2):
        e.send(gen(60, ident, first=10 * ident))
        e.read_until(m.PP, ident=ident)
        e.send(m.Yield(ident))
        e.read_until(m.Suspended, ident=ident)
    e.send(gen(8, 3, first=500))  # the third slot is free: nothing moves
    assert e.read_until(m.Done, ident=3)[-1].finish == "length"
    for ident in (1, 2):
        e.send(m.Resume(ident))
    seen = lines_until_done(e, {1, 2})
    dones = {x.id: x for x in seen if isinstance(x, m.Done)}
    assert all(d.extra["parks"] == "1" and float(d.extra["park_ms"]) == 0.0 for d in dones.values())  # no copy


def test_a_newcomer_moves_the_longest_parked_read_to_host_memory(engine_factory):
    e = start(engine_factory, "--slots", "1")
    e.send(gen(60, 1, fp=1))
    e.read_until(m.PP, ident=1)
    e.send(m.Yield(1))
    park_fp = next(x for x in e.read_until(m.Suspended, ident=1) if isinstance(x, m.FP)).digest
    e.send(gen(8, 2, first=500))  # no free slot: 1's rows move out, 2 takes the slot
    assert e.read_until(m.Done, ident=2)[-1].finish == "length"
    e.send(m.Resume(1))
    resumed = e.read_until(m.FP, ident=1)[-1]
    assert resumed.digest == park_fp  # brought back exactly
    done = e.read_until(m.Done, ident=1)[-1]
    assert done.finish == "length" and float(done.extra["park_ms"]) >= 0.0


def test_a_kept_conversation_is_reused_from_a_chunk_boundary(engine_factory):
    e = start(engine_factory, "--slots", "2")
    first = gen(30, 1)
    e.send(first)
    assert e.read_until(m.Done, ident=1)[-1].extra["cached"] == "0"
    longer = m.Gen(4, first.tokens + (7, 7, 7, 7, 7), {}, 2)  # the next turn: the history, then more
    e.send(longer)
    seen = e.read_until(m.Done, ident=2)
    info = next(x for x in seen if isinstance(x, m.Info))
    assert info.fields["cached"] == "28"  # 30 kept, rounded down to the chunk of 4
    assert [x.done for x in seen if isinstance(x, m.PP)][0] == 32  # reading went on from 28
    assert seen[-1].extra["cached"] == "28"
    e.send(m.Gen(4, first.tokens, {"reuse": 0}, 3))  # reuse=0: read from the start
    assert e.read_until(m.Done, ident=3)[-1].extra["cached"] == "0"


def test_without_prompt_reuse_nothing_is_kept(engine_factory):
    e = start(engine_factory, "--slots", "2", "--no-prompt-reuse")
    e.send(gen(30, 1))
    e.read_until(m.Done, ident=1)
    e.send(gen(30, 2))
    assert e.read_until(m.Done, ident=2)[-1].extra["cached"] == "0"


def test_a_long_chunk_pauses_between_layers_for_the_decoding_requests(engine_factory):
    """A chunk of 0.32 s in 8 layers, decoding requests wanting a step every 50 ms: the chunk pauses
    every layer (8 x 40 ms); a decoder gets several tokens between two of the read's PPs, not one.
    With --decode-interval-ms 0, one token per chunk, as before."""
    def tokens_between_reads(*args: str) -> list[int]:
        e = start(engine_factory, "--slots", "2", "--chunk-s", "0.32", "--layers", "8", "--token-s", "0.005", *args)
        e.send(gen(4, 1, max_new=200))
        e.read_until(m.T, ident=1)
        e.send(gen(16, 2, max_new=1, first=90))  # four chunks
        seen = e.read_until(m.Done, ident=2)
        e.send(m.Stop(1))
        assert float(seen[-1].extra["shared_ms"]) > 0  # the read waited for the decoder's steps
        order = [(type(x).__name__, x.id) for x in seen if isinstance(x, (m.T, m.PP))]
        reads = [i for i, (kind, ident) in enumerate(order) if kind == "PP" and ident == 2]
        return [sum(1 for kind, ident in order[i + 1 : j] if (kind, ident) == ("T", 1)) for i, j in zip(reads, reads[1:])]

    paused = tokens_between_reads("--decode-interval-ms", "50")
    assert paused and all(n >= 5 for n in paused)  # the first chunk sets the estimate: the others pause
    assert tokens_between_reads("--decode-interval-ms", "0") == [1, 1, 1]
