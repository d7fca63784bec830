"""Tensor parallelism across processes: the engine process is rank 0 and starts one worker process
per other rank. Each rank loads only its shard of the model (engine/model/weights.py load_model(shard=...)) and
keeps the K/V rows of its own heads in a pool of the same blocks as rank 0's, so a block table means
the same on every rank. Rank 0's runner (TensorParallelRunner) does what ModelRunner does and sends
each operation that touches the model or the cache to the workers first, over a pipe each, so that
every rank runs the same forward passes in the same order; the two all-reduces of each layer meet
there (ProcessGroup: the partials summed in rank order, as engine/parallel/tensor_parallel.py's ThreadGroup
adds them). Only rank 0 samples: every rank computes the same logits, and the workers skip them.

    rank 0 -> worker   ("pool", ctx, block_size, blocks, kv_type)  the KV pool, once rank 0 has sized it
                       ("forward", tokens, start, table, pauses)   a prompt chunk (pauses: rank 0 runs
                                                                   decode steps between its layers:
                                                                   "decode" lines, then "continue")
                       ("decode", tokens, tables, positions)       a decode step
                       ("spill", key, table, rows) / ("restore", key, table) / ("drop", keys)
                       ("digest", table, rows)                     answered ("digest", bytes)
    either way         ("part", array) / ("total", array)          an all-reduce
    worker -> rank 0   ("ready",) after loading; ("error", text) instead of anything when it fails

A worker is `python -m engine.parallel.tp_workers RANK WORLD FD`, its end of a socket pair as FD (a
multiprocessing Connection: pickled messages); it gets its WorkerSpec first, runs its BLAS on its
share of the cores, and exits when the pipe closes or the engine process dies, however it ended
(Linux's parent-death signal). The pipes carry the partials, which is what the CPU needs; across
GPUs the all-reduce would be NCCL's, inside each rank's decode graphs (issue 26: not yet available,
refused at start)."""
from __future__ import annotations

import hashlib
import itertools
import os
import signal
import socket
import subprocess
import sys
import traceback
import weakref
from dataclasses import dataclass
from multiprocessing.connection import Connection

import numpy as np

from engine.kvcache.kv import KVCache, KVSnapshot
from engine.core.parent_death import die_with_parent
from engine.runner.runner import ModelRunner
from engine.parallel.tensor_parallel import rank_sum


class WorkerError(RuntimeError):
    """A tensor-parallel worker failed (its message says where)."""


@dataclass(frozen=True)
class WorkerSpec:
    """What a worker needs to load its rank (the pool's size follows once rank 0 has planned it)."""
    path: str
    device: str
    rope: object  # engine.model.rope.RopeOverride


def checked(message):
    tag, *rest = message
    if tag == "error":
        raise WorkerError(rest[0])
    return tag, rest


def expect(conn, tag: str, who: str) -> list:
    """The next message on `conn`, which must be a `tag` (a worker's error raised as it is): its fields."""
    got, rest = checked(conn.recv())
    if got != tag:
        raise WorkerError(f"{who}: expected {tag!r}, got {got!r}")
    return rest


class ProcessGroup:
    """The all-reduce of one rank: the worker side sends its partial and gets the total; rank 0
    gathers the partials in rank order, adds them and sends the total to each."""

    def __init__(self, rank: int, conns: list):
        self.rank, self.conns = rank, conns

    def all_reduce(self, part):
        if self.rank:
            (conn,) = self.conns
            conn.send(("part", part))
            (total,) = expect(conn, "total", f"rank {self.rank}")
            return total
        total = rank_sum([part, *(expect(conn, "part", "rank 0")[0] for conn in self.conns)])
        for conn in self.conns:
            conn.send(("total", total))
        return total


def worker_main(rank: int, world: int, conn) -> None:
    """A worker process: load rank `rank`'s shard, say ready, then run rank 0's operations until the
    pipe closes."""
    try:
        spec: WorkerSpec = conn.recv()
        from engine.ops.backend import select_backend
        from engine.model.weights import load_model
        from engine.model.forward import LlamaModel

        backend = select_backend(spec.device)
        cfg, weights, _ = load_model(spec.path, backend, rope=spec.rope, shard=(rank, world))
        model = LlamaModel(cfg, weights, backend)
        model.reduce = ProcessGroup(rank, [conn]).all_reduce
        conn.send(("ready",))
        Worker(model, conn).serve()
    except (EOFError, BrokenPipeError, KeyboardInterrupt):
        return  # the engine process is gone
    except BaseException as e:  # noqa: BLE001 - reported to rank 0, which ends the engine with it
        try:
            conn.send(("error", f"tensor-parallel rank {rank}: {type(e).__name__}: {e}\n{traceback.format_exc()}"))
        except OSError:
            pass
        sys.exit(1)


class Worker:
    def __init__(self, model, conn):
        self.model, self.conn = model, conn
        self.kv: KVCache | None = None  # set by pool()
        self.snapshots: dict[int, KVSnapshot] = {}

    def serve(self, until: str | None = None) -> None:
        """Run rank 0's operations as they come; return on `until` (the end of a pause between layers)."""
        while True:
            tag, args = checked(self.conn.recv())
            if tag == until:
                return
            getattr(self, tag)(*args)

    def pool(self, ctx: int, block_size: int, blocks: int, kv_type: str) -> None:
        self.kv = KVCache(self.model.cfg, ctx, self.model.backend, block_size, blocks, kv_type)

    def forward(self, tokens, start: int, table, pauses: bool) -> None:
        between = (lambda _layer: self.serve(until="continue")) if pauses else None
        self.model.forward(tokens, start, self.kv.rows(table), want_logits=False, on_device=True, between=between)

    def decode(self, tokens, tables, positions) -> None:
        self.model.forward_batch(tokens, tables, positions, self.kv)

    def spill(self, key: int, table, rows: int) -> None:
        self.snapshots[key] = self.kv.snapshot(table, rows)

    def restore(self, key: int, table) -> None:
        self.kv.restore(table, self.snapshots.pop(key))

    def drop(self, keys) -> None:
        for key in keys:
            self.snapshots.pop(key, None)

    def digest(self, table, rows: int) -> None:
        self.conn.send(("digest", self.kv.digest(table, rows)))


@dataclass
class RankSnapshots:
    """A spilled request's rows on every rank: rank 0's here, the workers' under `key` in theirs."""
    local: KVSnapshot
    key: int
    world: int

    @property
    def nbytes(self) -> int:
        return self.local.nbytes * self.world


class TensorParallelRunner(ModelRunner):
    """ModelRunner over rank 0's shard, the workers following it (started here, `world` - 1 of them)."""

    def __init__(self, *args, world: int, workers: list, conns: list, **kwargs):
        super().__init__(*args, **kwargs)
        self.world, self.workers, self.conns = world, workers, conns
        self.model.reduce = ProcessGroup(0, conns).all_reduce
        self.keys = itertools.count()
        self.dropped: list[int] = []  # snapshots the loop let go of, dropped by the workers with the next operation
        self.send("pool", self.ctx, self.kv.block_size, self.kv.blocks, self.kv.type.name)

    @staticmethod
    def start_workers(world: int, spec: WorkerSpec) -> tuple[list, list]:
        """Ranks 1 .. world - 1 as processes, loading while the caller loads rank 0; each BLAS gets
        its rank's share of the cores."""
        threads = str(max(1, (os.cpu_count() or 1) // world))
        env = os.environ | {"OPENBLAS_NUM_THREADS": threads, "OMP_NUM_THREADS": threads}
        workers, conns = [], []
        for rank in range(1, world):
            mine, theirs = socket.socketpair()
            worker = subprocess.Popen([sys.executable, "-m", "engine.parallel.tp_workers", str(rank), str(world),
                                       str(theirs.fileno())], pass_fds=[theirs.fileno()], env=env,
                                      stdin=subprocess.DEVNULL)
            theirs.close()
            conn = Connection(mine.detach())
            conn.send(spec)
            workers.append(worker)
            conns.append(conn)
        return workers, conns

    @staticmethod
    def wait_ready(conns: list) -> None:
        for conn in conns:
            try:
                expect(conn, "ready", "a tensor-parallel worker")
            except EOFError:
                raise WorkerError("a tensor-parallel worker ended while loading") from None

    def close(self) -> None:
        """The workers see their pipes close and exit; waited for, so that none outlives the engine."""
        for conn in self.conns:
            conn.close()
        for worker in self.workers:
            try:
                worker.wait(10)
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait()

    def info(self) -> dict[str, str]:
        return super().info() | {"tp": str(self.world), "tp_pids": ",".join(str(w.pid) for w in self.workers)}

    def send(self, *message) -> None:
        if self.dropped:
            message_drop, self.dropped = ("drop", tuple(self.dropped)), []
            for conn in self.conns:
                conn.send(message_drop)
        for conn in self.conns:
            conn.send(message)

    def rows_invariant(self) -> bool:
        """The ranks read one sequence a step (their protocol carries one chunk)."""
        return False

    def forward(self, tokens, start: int, table, want_logits: bool, between=None, state=None, hidden_rows=None):
        """(state: a hybrid's, which tensor parallel refuses: engine/model/weights.py shard_config. hidden_rows:
        rank 0's, whose residual stream is whole after each layer's all-reduce.)"""
        self.send("forward", tokens, start, np.asarray(table, dtype=np.int32), between is not None)
        if between is None:
            return super().forward(tokens, start, table, want_logits, hidden_rows=hidden_rows)

        def paused(layer: int) -> None:  # the decode steps rank 0 runs here reach the workers as they run
            between(layer)
            self.send("continue")

        return super().forward(tokens, start, table, want_logits, paused, hidden_rows=hidden_rows)

    def decode_logits(self, tokens: list[int], tables: list[list[int]], positions: list[int], states=(),
                      meanwhile=None):
        self.send("decode", np.asarray(tokens, dtype=np.int64), [np.asarray(t, dtype=np.int32) for t in tables],
                  list(positions))
        return super().decode_logits(tokens, tables, positions, meanwhile=meanwhile)

    def snapshot_nbytes(self, seq) -> int:
        return super().snapshot_nbytes(seq) * self.world

    def spill(self, seq) -> RankSnapshots:
        key = next(self.keys)
        self.send("spill", key, np.asarray(seq.table, dtype=np.int32), seq.rows)
        snap = RankSnapshots(super().spill(seq), key, self.world)
        weakref.finalize(snap, self.dropped.append, key)  # restored or not: the workers let theirs go
        return snap

    def restore(self, seq, snap: RankSnapshots) -> None:
        self.send("restore", snap.key, np.asarray(seq.table, dtype=np.int32))
        super().restore(seq, snap.local)

    def fingerprint(self, seq) -> str:
        """Every rank's rows (in rank order) and the sampler's state."""
        self.send("digest", np.asarray(seq.table, dtype=np.int32), seq.kv_len)
        h = hashlib.blake2b(digest_size=16)
        h.update(super().fingerprint(seq).encode())
        for conn in self.conns:
            (digest,) = expect(conn, "digest", "rank 0")
            h.update(digest)
        return h.hexdigest()


if __name__ == "__main__":
    die_with_parent()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    worker_main(int(sys.argv[1]), int(sys.argv[2]), Connection(int(sys.argv[3])))
