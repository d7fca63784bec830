"""The engine's park gates and offer rules, through the engine loop (mock model, real loop)."""
from protocol import messages as m


def gen(n_prompt: int, ident: int = 1, max_new: int = 2) -> m.Gen:
    return m.Gen(max_new, tuple(range(10, 10 + n_prompt)), {}, ident)


def start(engine_factory, *args):
    e = engine_factory("--chunk", "4", "--chunk-s", "0.05", "--prefill-preempt", *args, mock=True)
    e.handshake()
    return e


def offer_and_read(e, until=(m.Suspended, m.Decline)):
    e.send(m.Yield())
    return e.read_until(*until, ident=1)[-1]


def test_min_tokens_gate_declines_early_offers(engine_factory):
    e = start(engine_factory, "--prefill-preempt-min-tokens", "12")
    e.send(gen(40))
    first = offer_and_read(e)
    assert (type(first), first.reason, first.done) == (m.Decline, "min_tokens", 4)
    while True:  # offers keep coming, as the server repeats them after each PP
        got = offer_and_read(e)
        if isinstance(got, m.Suspended):
            break
    assert got.done >= 12


def test_max_parks_gate_counts_every_park(engine_factory):
    e = start(engine_factory, "--prefill-preempt-max", "1")
    e.send(gen(40))
    assert isinstance(offer_and_read(e), m.Suspended)
    e.send(m.Resume(1))
    declined = offer_and_read(e)
    assert (type(declined), declined.reason) == (m.Decline, "max_parks")
    assert e.read_until(m.Done, ident=1)[-1].extra["parks"] == "1"


def test_snapshot_budget_is_checked_before_any_copy(engine_factory):
    e = start(engine_factory, "--prefill-preempt-snapshot-mib", "0")
    e.send(gen(40))
    declined = offer_and_read(e)
    assert (type(declined), declined.reason) == (m.Decline, "budget")
    done = e.read_until(m.Done, ident=1)[-1]  # A kept reading
    assert done.finish == "length" and done.extra["parks"] == "0"
    assert any("exceed the 0 MiB budget" in line for line in e.stderr)


def test_the_max_parked_gate_counts_parked_reads(engine_factory):
    e = start(engine_factory, "--prefill-preempt-max-parked", "1")
    e.send(gen(40, ident=1))
    assert isinstance(offer_and_read(e), m.Suspended)
    e.send(gen(40, ident=2))
    e.send(m.Yield())
    declined = e.read_until(m.Decline, m.Suspended, ident=2)[-1]
    assert (type(declined), declined.reason) == (m.Decline, "max_parked")


def test_a_stale_offer_does_not_repark_a_resumed_read(engine_factory):
    e = start(engine_factory)
    e.send(gen(40))
    assert isinstance(offer_and_read(e), m.Suspended)
    e.send(m.Yield())  # arrives while nothing runs: dropped
    e.send(m.Resume(1))
    rest = e.read_until(m.Done, ident=1)
    assert not [x for x in rest if isinstance(x, (m.Suspended, m.Decline))]


def test_cancel_of_an_unknown_or_resumed_park_is_an_error(engine_factory):
    e = start(engine_factory)
    e.send(m.Cancel(7))
    err = e.read()
    assert isinstance(err, m.Err) and err.id == 7 and "no parked request" in err.message
    e.send(m.Resume(7))
    assert "no parked request" in e.read().message


def test_a_failed_move_out_makes_the_parked_read_read_again(engine_factory):
    """A pool of 11 blocks of 4: a parked read moves to host memory when a newcomer's read needs its
    blocks; if that copy fails, its rows are dropped (declined as snapshot_failed) and its RESUME
    reads the prompt again from the start: the newcomer is not refused and the parked request loses
    nothing."""
    e = start(engine_factory, "--fail-snapshot", "--kv-tokens", "44")
    e.send(gen(40))
    assert isinstance(offer_and_read(e), m.Suspended)
    e.send(m.Gen(2, tuple(range(500, 540)), {}, 2))  # its own prompt: nothing shared with the parked read
    declined = e.read_until(m.Decline, ident=1)[-1]
    assert declined.reason == "snapshot_failed"
    assert e.read_until(m.Done, ident=2)[-1].finish == "length"
    e.send(m.Resume(1))
    seen = e.read_until(m.Done, ident=1)
    assert [x.done for x in seen if isinstance(x, m.PromptProgress)][0] == 4  # from the start again
    assert seen[-1].finish == "length" and seen[-1].generated == 2
    assert any("moving a parked read out failed" in line for line in e.stderr)
