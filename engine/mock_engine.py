"""A protocol-level mock engine: the real engine loop (engine/loop/) over a fake model.

Same lines as `strata --serve`, no weights: prompt chunks and decode steps (of one request or a
batch of them) take configurable time, output is the prompt echoed back or a scripted token list,
and faults can be injected. With --max-running N, up to N requests are in the engine at once, as in
strata, over a pool of --kv-tokens in blocks of --kv-block (bookkeeping only: memory pressure,
the prefix cache, DEFER and pauses behave as in strata).

    python -m engine.mock_engine [--max-running 1] [--kv-tokens T] [--kv-block B] [--no-prompt-reuse] [--chunk 64]
        [--chunk-s 0.01] [--row-s 0] [--token-s 0.005] [--layers 1] [--decode-interval-ms 50] [--script 1,2,3]
        [--no-prefill-preempt] [--die-at-chunk K] [--die-at-gen K] [--die-after-tokens K] [--die-while-parked]
        [--poison-token T] [--faults-once PATH] [--malformed-at-chunk K] [--fail-snapshot] [--oom-at-running N]
        [--no-preempt-cap]
        [--start-delay S] [--picked]

Output depends only on the request and the position in its answer, so a request continued on a
restarted mock (GEN with prompt + tokens so far, drawn=k) goes on with the very same tokens.
"""
from __future__ import annotations

import argparse
import hashlib
import os
import sys
import threading
import time

import numpy as np

from engine.kvcache.block_pool import BlockPool
from engine.cli import add_preempt_args, add_slots_arg, policy_from_args
from engine.config import default_block
from engine.kvcache.host_shelf import HostShelf
from engine.kvcache.host_tier import HostTier
from engine.loop.loop import EngineLoop, engine_caps
from engine.loop.step_limits import StepLimits
from engine.loop.protocol_io import Writer
from engine.runner.sequence import Sequence
from engine.runner.row_cost import RowCost

FAULT_EXIT_CODE = 70  # (EX_SOFTWARE: none of the engine's own statuses, protocol/messages.py)


class FakeRunner:
    """Implements the runner interface of engine/runner/runner.py with sleeps and scripted tokens."""

    def __init__(self, a: argparse.Namespace, write_raw):
        self.a, self.write_raw = a, write_raw
        self.ctx, self.chunk, self.vocab_size, self.layers = a.ctx, a.chunk, a.vocab, a.layers
        self.max_running, self.max_batch = a.max_running, 64
        self.runs_async = False  # (a decode step's sleep is the host's)
        self.decoder = None  # no decode graphs (engine/runner/decode_graph.py): every row costs its pass
        block = a.kv_block or default_block(a.chunk)
        block_bytes = block * a.bytes_per_token
        tier = HostTier.sized(round((a.cache_ram_gib or 0) * 2**30), block_bytes, lambda slots: HostShelf([], slots))  # (no rows)
        self.pool = BlockPool(-(-(a.kv_tokens or a.ctx * max(4, a.max_running)) // block), block, tier)
        self.ctx = min(self.ctx, self.pool.total * block)  # one request always fits the pool, as in strata
        self.eos_ids = frozenset({a.eos})
        self.script = tuple(int(t) for t in a.script.split(",")) if a.script else None
        self.chunks_read = self.gens_started = self.tokens_written = 0
        self.shape_free = a.shape_free  # reads share a step (engine/loop/rounds.py), as on a row-invariant backend
        self.recurrent = self.state_cache = None  # no hybrid model's state (engine/runner/runner.py)
        self.draft_max, self.draft_model = 0, None  # no speculative decoding
        self.row_cost = RowCost(prior=1.0)  # (the decode steps measure it all the same)
        self.expert_caches = []  # no mixture of experts
        self.read_align = 1  # reads end anywhere
        self.step_keys = None

    def constraint(self, grammar: str):
        raise ValueError("the mock engine applies no grammars")

    def info(self) -> dict[str, str]:
        return {"model": "mock", "ctx": str(self.ctx), "chunk": str(self.chunk), "device": "none",
                "max_running": str(self.max_running), "kv_blocks": str(self.pool.total),
                "kv_block": str(self.pool.size), "kv_block_bytes": str(self.pool.size * self.a.bytes_per_token),
                "cache_ram_blocks": str(self.pool.tier.capacity if self.pool.tier else 0),
                "shape_free": str(int(self.shape_free)), "version": "mock"}

    def die(self, once: bool = True) -> None:
        """Exit like a crash. With --faults-once PATH, a one-shot fault fires in the first process
        only: the one that fires creates PATH, and a later process that finds it fires none."""
        if once and self.a.faults_once:
            try:
                os.close(os.open(self.a.faults_once, os.O_CREAT | os.O_EXCL))
            except FileExistsError:
                return
        os._exit(FAULT_EXIT_CODE)

    def synchronize(self) -> None:
        pass

    def read_prompts(self, pieces: list[tuple[Sequence, int]], between=None) -> None:
        """A step's time (a chunk's whatever the reads in it, or --row-s a row) in `layers` equal parts, `between(i)`
        after each but the last."""
        for seq, _ in pieces:
            if seq.pos == 0:
                self.gens_started += 1
                if self.gens_started == self.a.die_at_gen:  # the GEN is taken but never answered
                    self.die()
                if self.a.poison_token in seq.prompt:
                    self.die(once=False)
        seconds = self.a.row_s * sum(end - seq.pos for seq, end in pieces) if self.a.row_s else self.a.chunk_s
        for layer in range(self.layers):
            time.sleep(seconds / self.layers)
            if between is not None and layer + 1 < self.layers:
                between(layer)
        self.chunks_read += 1
        if self.chunks_read == self.a.die_at_chunk:
            self.die()
        if self.chunks_read == self.a.malformed_at_chunk:
            self.write_raw("PP this-is-not-a-number")
        for seq, end in pieces:
            seq.pos = end
            if not seq.reading:
                seq.logits = self.one_hot(self.scripted(seq, 0))

    def decode_batch(self, seqs: list[Sequence], meanwhile=None) -> None:
        """One step for the whole batch: it takes a token's time, whatever the batch size (meanwhile, the host's
        work, done as it starts)."""
        if self.a.oom_at_running and len(seqs) >= self.a.oom_at_running:
            raise MemoryError(f"injected: out of memory with {len(seqs)} decoding")
        for seq in seqs:
            self.tokens_written += 1  # the loop has written one more T line for each
            if self.tokens_written == self.a.die_after_tokens:
                self.die()
        if meanwhile is not None:
            meanwhile()
        time.sleep(self.a.token_s)
        if not self.a.picked:
            for seq in seqs:
                seq.logits = self.one_hot(self.scripted(seq, len(seq.generated)))

    def sample(self, seq: Sequence) -> int:
        if self.a.picked:  # (drawn ahead: the scripted token, a uniform taken for it)
            token, seq.picked = seq.picked, None
            return self.scripted(seq, len(seq.generated)) if token is None else token
        return seq.sampler.sample(seq.logits)

    def pick_ahead(self, seqs: list[Sequence]) -> None:
        """(A GPU's draws of a step's rows at once: with --picked each row's scripted token, a uniform taken for it,
        as the batched draws take one; else none here.)"""
        if self.a.picked:
            for seq in seqs:
                if seq.draws_ahead:
                    seq.sampler.uniform()
                    seq.picked = self.scripted(seq, len(seq.generated))

    def logprobs(self, seq: Sequence, token: int):
        return seq.sampler.logprobs(seq.logits, token, seq.logprobs)

    def scripted(self, seq: Sequence, i: int) -> int:
        """Token i of this request's answer: the script, or the original prompt echoed, cycled (a continuation's
        prompt is the original's: its tokens so far are generated's first, engine/runner/sequence.py replay)."""
        source = self.script or seq.prompt
        return source[i % len(source)]

    def one_hot(self, token: int) -> np.ndarray:
        logits = np.full(self.vocab_size, -np.inf, dtype=np.float32)  # (vocab,)
        logits[token] = 0.0
        return logits

    def memory_report(self) -> str:
        return f"a mock's pool of {self.pool.total} blocks"

    def snapshot_nbytes(self, seq: Sequence) -> int:
        return seq.pos * self.a.bytes_per_token

    def spill(self, seq: Sequence):
        if self.a.fail_snapshot and seq.parked:
            raise MemoryError("injected: snapshot allocation failed")
        return seq.rows, self.pool.blocks_for(seq.rows)  # what a real snapshot holds: its rows' blocks

    def restore(self, seq: Sequence, snapshot) -> None:
        rows, blocks = snapshot
        assert rows == seq.rows and len(seq.table) >= blocks, (snapshot, seq.rows, seq.table)

    def set_aside(self, seq: Sequence) -> None:
        pass

    def park(self, seq: Sequence) -> None:
        if self.a.die_while_parked:
            threading.Timer(0.2, self.die).start()

    def fingerprint(self, seq: Sequence) -> str:
        state = (seq.prompt[: seq.pos], seq.pos, tuple(seq.generated), seq.sampler.state_digest())
        return hashlib.blake2b(repr(state).encode(), digest_size=16).hexdigest()


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m engine.mock_engine", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--serve", action="store_true", help="accepted for symmetry with strata")
    p.add_argument("--ctx", type=int, default=8192)
    p.add_argument("--chunk", type=int, default=64, help="prompt tokens per chunk")
    p.add_argument("--chunk-s", type=float, default=0.01, help="seconds per prompt chunk")
    p.add_argument("--row-s", type=float, default=0.0,
                   help="seconds per prompt row instead (a step's time its rows', as on a GPU; 0: --chunk-s a step)")
    p.add_argument("--layers", type=int, default=1,
                   help="parts of a chunk, between which it may pause for decode steps (--decode-interval-ms)")
    p.add_argument("--token-s", type=float, default=0.005, help="seconds per generated token")
    p.add_argument("--vocab", type=int, default=49152)
    p.add_argument("--eos", type=int, default=2)
    p.add_argument("--script", help="comma-separated token ids to emit, cycled (default: echo the prompt)")
    p.add_argument("--bytes-per-token", type=int, default=1024, help="simulated snapshot size")
    p.add_argument("--picked", action="store_true", help="a step's tokens drawn ahead, as a GPU's batched draws (no "
                   "logits, no host sampling, no log-probabilities: the loop's own cost, bench/loop_cost_bench.py)")
    p.add_argument("--kv-tokens", type=int, help="the simulated KV pool in tokens (default: ctx x max(4, max-running))")
    f = p.add_argument_group("faults")
    f.add_argument("--die-at-chunk", type=int, default=0, help="exit during the K-th prompt chunk read")
    f.add_argument("--die-at-gen", type=int, default=0, help="exit on taking the K-th request, before any line")
    f.add_argument("--die-after-tokens", type=int, default=0, help="exit after writing the K-th token")
    f.add_argument("--die-while-parked", action="store_true", help="exit shortly after a park")
    f.add_argument("--poison-token", type=int, default=-1,
                   help="exit whenever a prompt holds token T (in every process: a poison request)")
    f.add_argument("--faults-once", metavar="PATH",
                   help="the die-at/after faults fire in the first process only (PATH marks it)")
    f.add_argument("--fail-snapshot", action="store_true", help="every snapshot copy fails (MemoryError)")
    f.add_argument("--oom-at-running", type=int, default=0,
                   help="a decode step of this many requests or more runs out of memory (MemoryError)")
    f.add_argument("--malformed-at-chunk", type=int, default=0, help="print a malformed line at chunk K")
    f.add_argument("--no-preempt-cap", action="store_true", help="omit `preempt` from READY")
    f.add_argument("--start-delay", type=float, default=0.0, help="seconds before INFO/READY")
    p.add_argument("--shape-free", action="store_true",
                   help="reads share a step and end anywhere, as where the kernels' rows do not depend on the step")
    add_slots_arg(p)
    add_preempt_args(p)
    p.set_defaults(prefill_preempt_min_tokens=0, max_running=1)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    time.sleep(args.start_delay)
    policy = policy_from_args(args)
    caps = ("stop",) if args.no_preempt_cap else engine_caps(policy)
    write = Writer(sys.stdout)
    limits = StepLimits(args.decode_interval_ms, args.step_tokens, args.step_ms, args.burst_ms)
    EngineLoop(FakeRunner(args, write.raw), policy, write, caps, args.prompt_reuse, limits).serve(sys.stdin)
    return 0


if __name__ == "__main__":
    sys.exit(main())
