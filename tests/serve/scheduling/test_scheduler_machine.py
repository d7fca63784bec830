"""The scheduler as a state machine (hypothesis stateful): random arrivals (lengths, priorities,
answer lengths, some starting with one of two shared system prompts), clients leaving (a STOP for a running request, a CANCEL for a parked one), time
passing and engine deaths, against the real engine loop over the mock's fake model, in process
and on a fake clock so that hundreds of steps take a second.

Lines cross in both directions through the protocol codec; the engine runs one round per `step`.
Invariants after every step: no request in two places, never more running than the cap, the KV
pool consistent (no block both free and referenced, reference counts equal the block tables that
hold them, every cached block's key its tokens' chain), the parked
reads' reserved snapshot bytes within the budget, decode never parked; after each engine round, no
parked read postponed past max-wait waits beside a free slot. At the end the machine drains: every request whose
client stayed is answered exactly once, with the whole answer (the mock echoes its prompt), or
fails as a poison request after max-retries deaths; nothing is left running, parked or waiting.
"""
from __future__ import annotations

from hypothesis import HealthCheck, settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from engine.loop.loop import EngineLoop, engine_caps
from engine.loop.park_policy import ParkPolicy
from engine.loop.step_limits import StepLimits
from protocol import messages as m
from protocol.codec import decode, encode
from engine.mock_engine import FakeRunner, build_parser
from serve.engine_proc.engine_client import EngineInfo, EngineState
from serve.scheduling.metrics import Metrics
from serve.scheduling.request import EngineFailure, Phase, Request
from serve.scheduling.scheduler import Scheduler

SLOTS, MAX_WAIT_S, MAX_RETRIES, BYTES_PER_TOKEN = 3, 5.0, 2, 1024
HOST_BLOCKS = 6  # the host tier keeps six evicted blocks of 16 positions
HEADS = {1: list(range(40000, 40064)), 2: list(range(45000, 45064))}  # two system prompts of four chunks
POLICY = ParkPolicy(enabled=True, min_tokens=0, max_parks=3, budget_bytes=120 * BYTES_PER_TOKEN, max_parked=2)


class Clock:
    """The scheduler's clock (its `clock`): time passes only when a rule says so."""

    def __init__(self):
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


class InProcessEngine:
    """What the scheduler sees of an engine (EngineClient's surface), over an EngineLoop run in
    process: sent lines go to the loop's inbox, its lines are collected for the scheduler."""

    def __init__(self, slots: int, kv_tokens: int, shape_free: bool = False):
        """shape_free: reads share the engine's steps (the mock's --shape-free, 40 rows a step)."""
        self.state, self.failure, self.out = EngineState.READY, "", []
        args = build_parser().parse_args(["--max-running", str(slots), "--kv-tokens", str(kv_tokens), "--chunk", "16",
                                          "--chunk-s", "0", "--token-s", "0", "--bytes-per-token", str(BYTES_PER_TOKEN),
                                          "--cache-ram", str(HOST_BLOCKS * 16 * BYTES_PER_TOKEN / 2**30),
                                          "--step-tokens", "40"] + (["--shape-free"] if shape_free else []))
        runner = FakeRunner(args, lambda line: None)
        self.info = EngineInfo(ctx=kv_tokens, caps=engine_caps(POLICY), fields=runner.info())
        self.loop = EngineLoop(runner, POLICY, self.out.append, self.info.caps,
                               limits=StepLimits(step_tokens=args.step_tokens))

    @property
    def ready(self) -> bool:
        return self.state is EngineState.READY

    def send(self, msg: m.Message) -> None:
        self.loop.inbox.put(decode(encode(msg)))

    def step(self) -> list[m.Message]:
        """The lines sent so far are taken, then one round runs; what the engine wrote comes back."""
        self.loop.take_lines(block=False)
        if self.loop.busy:
            self.loop.round()
        out, self.out[:] = [decode(encode(x)) for x in self.out], []
        return out

    def step_and_deliver(self, scheduler: Scheduler) -> int:
        """One step, its lines handed to the scheduler; how many there were."""
        out = self.step()
        for msg in out:
            scheduler.on_message(msg)
        return len(out)


class SchedulerMachine(RuleBasedStateMachine):
    slots = SLOTS
    kv_tokens = 256  # four requests of up to 90 + 12 tokens do not all fit: DEFER, moves out, pauses
    shape_free = False  # the engine's reads share its steps (SharedStepsMachine)

    @initialize()
    def start(self):
        self.clock = Clock()
        self.scheduler = Scheduler(Metrics(), preempt=True, max_wait_s=MAX_WAIT_S, max_retries=MAX_RETRIES,
                                   eos_ids=frozenset({2}), aged_s=1.0, clock=self.clock.monotonic)
        self.scheduler.engine = self.engine = InProcessEngine(self.slots, self.kv_tokens, self.shape_free)
        self.requests: list[Request] = []
        self.left: set[int] = set()
        self.deaths = 0

    def teardown(self):
        if hasattr(self, "scheduler"):
            self.check_answers()

    # ------------------------------------------------------------ rules

    @rule(n=st.integers(1, 90), priority=st.integers(0, 1), max_tokens=st.integers(1, 12),
          head=st.sampled_from([0, 1, 1, 2, 2]), shared=st.integers(1, 64))
    def arrive(self, n, priority, max_tokens, head=0, shared=0):
        base = 1000 + 200 * len(self.requests)
        prompt = (HEADS[head][:shared] if head else []) + list(range(base, base + n))
        req = Request(prompt, max_tokens, {"temperature": 0.0}, priority=priority, arrived=self.clock.now)
        self.requests.append(req)
        self.scheduler.submit(req)

    @rule(rounds=st.integers(1, 6))
    def step(self, rounds):
        for _ in range(rounds):
            if self.round():  # lines came: the scheduler had its chance to act on the time passed
                self.no_read_postponed_too_long_beside_a_free_slot()
            self.the_server_knows_which_parked_reads_hold_blocks()

    @rule(dt=st.floats(0.05, 3.0))
    def time_passes(self, dt):
        self.clock.now += dt

    @precondition(lambda self: any(self.live()))
    @rule(data=st.data())
    def client_leaves(self, data):
        req = data.draw(st.sampled_from(self.live()))
        self.left.add(req.id)
        self.scheduler.abandon(req)  # STOP when running, CANCEL when parked, dropped when waiting

    @precondition(lambda self: self.deaths < 3)
    @rule()
    def engine_dies(self):
        """The process is gone with what it held; the restarted one starts empty."""
        self.deaths += 1
        self.engine.state = EngineState.RESTARTING
        self.scheduler.on_engine_exit("the engine exited (test)")
        fresh = InProcessEngine(self.slots, self.kv_tokens)
        self.engine.loop, self.engine.out = fresh.loop, fresh.out
        self.engine.state = EngineState.READY
        self.scheduler.on_engine_ready()

    # ------------------------------------------------------------ invariants

    @invariant()
    def each_request_in_one_place(self):
        s = self.scheduler
        places = [r.id for r in list(s.waiting) + s.running + s.parked]
        assert len(places) == len(set(places))
        assert set(r.id for r in s.places.line) <= set(r.id for r in s.running)
        assert all(r.phase is Phase.PARKED for r in s.parked) and all(r.phase is Phase.QUEUED for r in s.waiting)

    @invariant()
    def never_more_running_than_the_cap(self):
        assert len(self.scheduler.running) <= self.slots
        assert sum(not s.parked for s in self.engine.loop.requests.seqs.values()) <= self.slots

    @invariant()
    def the_pool_is_consistent(self):
        loop = self.engine.loop
        seqs, memory = loop.requests.seqs, loop.memory
        settling = [seq for seq in loop.requests.line if seq.settling]  # answers read again: out of seqs
        memory.pool.check([seq.table for seq in list(seqs.values()) + settling])
        for seq in seqs.values():  # a request's blocks cover what it has read (unless moved out)
            assert seq.paused or seq.id in memory.snapshots or len(seq.table) * memory.pool.size >= seq.kv_len

    @invariant()
    def parked_bytes_within_the_budget_and_decode_never_parked(self):
        loop = self.engine.loop
        assert sum(loop.parking.reserved.values()) <= POLICY.budget_bytes
        assert len(loop.parking.reserved) <= POLICY.max_parked
        assert all(s.reading and not s.generated for s in loop.requests.seqs.values() if s.parked)

    def no_read_postponed_too_long_beside_a_free_slot(self):
        """After the engine's lines of a round have been handled (the scheduler acts on lines, not
        on a timer), a parked read postponed past max-wait does not wait beside a free slot."""
        s = self.scheduler
        if s.parked and len(s.running) < self.slots and s.engine.ready and not s.memory_full:
            assert not s.admission.postponed_too_long(s.parked[0])

    def the_server_knows_which_parked_reads_hold_blocks(self):
        """INFO host=1 / host=0 follow a parked read's moves to host memory and back; checked when no
        line is in flight."""
        if not self.engine.loop.inbox.empty():
            return
        engine_seqs = self.engine.loop.requests.seqs
        for req in self.scheduler.parked:
            seq = engine_seqs.get(req.id)
            if seq is not None and seq.parked:
                assert req.in_host == (seq.id in self.engine.loop.memory.snapshots), (req.in_host, seq.table)

    # ------------------------------------------------------------ the end

    def round(self) -> int:
        """One engine step with its lines delivered; how many lines there were."""
        return self.engine.step_and_deliver(self.scheduler)

    def live(self) -> list[Request]:
        return [r for r in self.requests if r.id not in self.left and r.phase is not Phase.DONE]

    def check_answers(self):
        """Drain (time passing too), then every staying client's events: exactly one end."""
        s, quiet = self.scheduler, 0
        while (s.waiting or s.running or s.parked or self.engine.loop.busy) and quiet < 200:
            quiet = 0 if self.engine.step_and_deliver(s) else quiet + 1  # 200 quiet rounds: 10 s past
            self.clock.now += 0.05
        assert not (s.waiting or s.running or s.parked), "the machine did not drain (a deadlock)"
        engine_seqs = self.engine.loop.requests.seqs
        assert not engine_seqs or all(x.parked is False for x in engine_seqs.values())
        for req in self.requests:
            events = []
            while not req.events.empty():
                events.append(req.events.get_nowait())
            if req.id in self.left:
                continue
            ends = [e for e in events if isinstance(e, (m.Done, m.Err, EngineFailure))]
            assert len(ends) == 1, (req.id, ends)
            tokens = [e.token for e in events if isinstance(e, m.Token)]
            if isinstance(ends[0], EngineFailure):
                assert req.deaths_running >= MAX_RETRIES, ends[0]  # a poison request, after its deaths
            else:
                assert isinstance(ends[0], m.Done) and ends[0].finish == "length", ends[0]
                assert tokens == [req.prompt[i % len(req.prompt)] for i in range(req.max_tokens)]


TestScheduler = SchedulerMachine.TestCase
TestScheduler.settings = settings(max_examples=100, stateful_step_count=50, deadline=None,
                                  suppress_health_check=list(HealthCheck))


class SharedStepsMachine(SchedulerMachine):
    """The same machine over an engine whose reads share its steps (pieces of any length, prefixes
    reused to the block), which the scheduler then parks only for waiters."""
    shape_free = True


TestSharedSteps = SharedStepsMachine.TestCase
TestSharedSteps.settings = settings(max_examples=50, stateful_step_count=50, deadline=None,
                                    suppress_health_check=list(HealthCheck))


def test_long_long_short_in_a_small_pool_drains():
    """The case that deadlocked upstream: two long reads and a short request, one running at a time,
    over a pool of 96 tokens. A reads, B and C wait until B is old enough to make A park; waiters go
    in arrival order, so B goes in and parks in turn for C; C finishes, A resumes and needs the room
    B's parked read holds, so B's rows move to host memory; then A and B finish: all answered,
    nothing left."""
    machine = SchedulerMachine()
    machine.slots, machine.kv_tokens = 1, 96
    machine.start()
    try:
        machine.arrive(n=90, priority=0, max_tokens=4)
        machine.step(rounds=2)
        machine.arrive(n=80, priority=0, max_tokens=4)
        machine.arrive(n=3, priority=0, max_tokens=4)
        machine.time_passes(2.0)  # B has waited past aged_s: A is offered a park at its next boundary
        moved_out = []
        for _ in range(30):
            machine.step(rounds=1)
            moved_out += [r.id for r in machine.scheduler.parked if r.in_host]
        assert moved_out  # a parked read went to host memory to make room
    finally:
        machine.teardown()  # drains and checks every answer


class RecordingEngine:
    """An engine the test speaks for: what the scheduler sends is recorded."""

    def __init__(self):
        self.state, self.failure, self.sent = EngineState.READY, "", []
        self.info = EngineInfo(ctx=4096, caps=("stop", "preempt"), fields={"max_running": "4"})

    @property
    def ready(self) -> bool:
        return True

    def send(self, msg: m.Message) -> None:
        self.sent.append(msg)


def test_a_request_deferred_for_memory_goes_in_when_the_read_holding_it_parks():
    """A deadlock seen under memory pressure: B's GEN is deferred while A's read holds the pool, the
    scheduler offers A a park for B, A parks, and nothing else runs. A parked read's blocks can be
    moved out, so the park must let B in: waiting for a DONE would wait forever."""
    clock = Clock()
    scheduler = Scheduler(Metrics(), preempt=True, max_wait_s=MAX_WAIT_S, max_retries=MAX_RETRIES,
                          eos_ids=frozenset({2}), aged_s=1.0, clock=clock.monotonic)
    scheduler.engine = engine = RecordingEngine()
    a = Request(list(range(1000, 1900)), 4, {"temperature": 0.0}, arrived=clock.now)
    scheduler.submit(a)
    scheduler.on_message(m.PromptProgress(256, 900, 10.0, 25600.0, a.id))
    b = Request(list(range(3000, 3100)), 4, {"temperature": 0.0}, arrived=clock.now)
    scheduler.submit(b)
    assert [x.id for x in engine.sent if isinstance(x, m.Gen)] == [a.id, b.id]
    scheduler.on_message(m.Defer("memory", b.id))
    assert scheduler.memory_full and b in scheduler.waiting
    clock.now += 2.0  # B is old enough for A to make way
    scheduler.on_message(m.PromptProgress(512, 900, 10.0, 25600.0, a.id))
    assert any(isinstance(x, m.Yield) and x.id == a.id for x in engine.sent)
    scheduler.on_message(m.Suspended(512, 900, a.id))
    assert isinstance(engine.sent[-1], m.Gen) and engine.sent[-1].id == b.id, engine.sent
    assert not scheduler.memory_full and b in scheduler.running


def test_a_paused_request_comes_back_by_moving_a_parked_read_out():
    """The engine half of that deadlock: X is paused into host memory, then P's read parks holding
    the blocks X needs to come back. New GENs are deferred while X is paused and the server will
    not RESUME P, so X must come back by moving P's rows out (as a chunk or a GEN would), not wait."""
    engine = InProcessEngine(slots=4, kv_tokens=96)  # six blocks of 16
    loop = engine.loop
    engine.send(m.Gen(8, tuple(range(1000, 1090)), {"temperature": 0.0}, 1))  # P: 90 tokens
    engine.send(m.Gen(8, tuple(range(2000, 2040)), {"temperature": 0.0}, 2))  # X: 40 tokens
    loop.take_lines(block=False)
    requests, rounds, memory, parking = loop.requests, loop.rounds, loop.memory, loop.parking
    p, x = requests.seqs[1], requests.seqs[2]
    for _ in range(3):
        rounds.read_step(rounds.plan.pieces())  # P reads three chunks
    parking.try_park(p)
    for _ in range(3):
        rounds.read_step(rounds.plan.pieces())  # X reads its prompt and draws its first token
    memory.pause(x)
    parking.resume(p.id)
    rounds.read_step(rounds.plan.pieces())  # P's fourth chunk
    parking.try_park(p)  # P holds four blocks of six; X needs three to come back
    assert p.parked and len(p.table) == 4 and x.paused and memory.pool.available < 3
    loop.round()
    assert not x.paused and p.id in memory.snapshots and not p.table  # P's rows went to host memory
    memory.pool.check([s.table for s in requests.seqs.values()])


def test_where_reads_share_a_step_only_a_waiter_is_worth_a_park():
    """An engine that says shape_free reads every request in its line in the same steps: a shorter read
    behind the front one is no reason to park it (it would only wait for the others to finish); a
    short waiter the engine has no room for still is."""
    for shared, offered in (("0", True), ("1", False)):
        clock = Clock()
        scheduler = Scheduler(Metrics(), preempt=True, max_wait_s=MAX_WAIT_S, max_retries=MAX_RETRIES,
                              eos_ids=frozenset({2}), aged_s=1.0, clock=clock.monotonic)
        scheduler.engine = engine = RecordingEngine()
        engine.info.fields["shape_free"] = shared
        a = Request(list(range(1000, 1900)), 4, {"temperature": 0.0}, arrived=clock.now)
        b = Request(list(range(3000, 3100)), 4, {"temperature": 0.0}, arrived=clock.now)
        scheduler.submit(a)
        scheduler.submit(b)  # in the engine, behind A: 100 tokens against A's 900
        scheduler.on_message(m.PromptProgress(256, 900, 10.0, 25600.0, a.id))
        assert any(isinstance(x, m.Yield) for x in engine.sent) == offered, shared
    engine.sent.clear()
    for i in range(3):  # the engine is full (max_running 4): the next short request waits in the queue
        scheduler.submit(Request(list(range(5000 + 100 * i, 5090 + 100 * i)), 4, {}, arrived=clock.now))
    scheduler.on_message(m.PromptProgress(512, 900, 10.0, 25600.0, a.id))
    assert any(isinstance(x, m.Yield) and x.id == a.id for x in engine.sent)
