"""ModelRunner: the model, its KV cache and the backend, behind the interface the loop drives."""
from __future__ import annotations

import hashlib
from functools import partial
from typing import Callable

import numpy as np

from engine import __version__
from engine.ops.backend import Backend
from engine.runner.decode_graph import GraphDecoder, decode_or_eager
from engine.runner.grammar_mask import compile_constraint
from engine.runner.picks import DrawsBehind, Picks
from engine.modelfile.model_config import ModelConfig
from engine.model.layer_weights import Weights
from engine.kvcache.block_pool import BlockPool
from engine.kvcache.host_tier import HostTier
from engine.kvcache.kv import KVCache, KVSnapshot
from engine.model.forward import LlamaModel
from engine.model.hybrid import HybridModel
from engine.kvcache.recurrent import SequenceState, zero_state
from engine.kvcache.state_memory import PARKED_READS, StateMemory, states_made
from engine.ops.expert_cache import caches
from engine.kvcache.state_cache import StateCache
from engine.ops.delta_rule import CHUNK as STATE_CHUNK
from engine.core.chunks import chunk_end
from engine.core.memory import device_memory_report
from engine.runner.hidden_rows import hidden_rows, take_hidden
from engine.runner.row_check import rows_invariant_said
from engine.runner.row_cost import PRIORS, RowCost
from engine.runner.sequence import Sequence


MAX_BATCH = 64  # rows of one decode forward (the flash-decoding counters hold 64 sequences); more go in several


class ModelRunner:
    def __init__(self, cfg: ModelConfig, weights: Weights, backend: Backend, ctx: int, chunk: int,
                 eos_ids: frozenset[int], model_path: str = "", memory: dict[str, str] | None = None,
                 cuda_graphs: bool = True, max_running: int = 1, blocks: int | None = None,
                 block_size: int = 64, cache_ram_bytes: int = 0, kv_type: str = "auto", parked: int = PARKED_READS):
        self.cfg, self.backend, self.ctx, self.chunk = cfg, backend, ctx, chunk
        self.max_running, self.max_batch = max_running, MAX_BATCH
        self.memory = memory or {}
        self.model, gpu = (HybridModel if cfg.hybrid else LlamaModel)(cfg, weights, backend), backend.name == "gpu"
        # (on a GPU a hybrid's states are made in a pool of their own, its room taken now: the memory plan's)
        self.state_memory = StateMemory(backend.xp, states_made(max_running, parked),  # (parked: reads at a time)
                                        partial(zero_state, cfg, backend.xp, chunk)) if cfg.hybrid and gpu else None
        self.recurrent = zero_state(cfg, backend.xp, chunk)  # a hybrid's fresh recurrent state, else None
        self.read_align = 1 if self.recurrent is None else STATE_CHUNK  # where a read short of its prompt's end may end
        self.expert_caches = caches(weights.layers)  # routed experts behind device slots (engine/ops/expert_cache.py)
        graphs = cuda_graphs and backend.name == "gpu"  # (an expert cache's decode reads through device tables)
        # (with decode graphs a spare block past the pool for the padding rows of a graph's batch to write in)
        self.kv = KVCache(cfg, ctx, backend, block_size, blocks, kv_type, spare=int(graphs))
        tier = HostTier.sized(cache_ram_bytes, self.kv.block_bytes, self.kv.shelf)
        if tier is not None and gpu:  # page-locked in a thread of its own before an eviction needs it (host_shelf.py)
            tier.shelf.make_ahead()
        self.pool = BlockPool(self.kv.usable, block_size, tier)
        self.state_cache = StateCache(block_size) if self.recurrent is not None else None  # a hybrid's, at prefixes
        self.decoder = GraphDecoder(self.model, self.kv, backend, self.kv.usable,
                                    self.recurrent and SequenceState.fresh(self.recurrent)) if graphs else None
        self.picks = Picks(backend, self.decoder, cfg.vocab_size)
        # a token drawn from a request's logits where they are, a step's draws at once before each is drawn (on a
        # GPU), and the log-probabilities a request asks for (engine/runner/picks.py)
        self.sample, self.pick_ahead, self.logprobs = self.picks.sample, self.picks.ahead, self.picks.logprobs
        self.eos_ids, self.vocab_size, self.model_path = eos_ids, cfg.vocab_size, model_path
        self.grammars = None  # engine/modelfile/grammar_tokenizer.py, set once the tokenizer is read
        self.escapes = None  # the n-gram drafts' escaped prompts (engine/runner/escaped_prompt.py), set likewise
        self.draft_max, self.draft_model = 0, None  # speculative decoding's most drafts (0: off), draft model
        self.runs_async = gpu  # a decode step runs on the device while the host goes on (decode_batch's meanwhile)
        self.row_cost = RowCost(PRIORS[backend.name])  # what a drafted row costs (engine/runner/row_cost.py)
        self.speculates = self.recurrent is None  # set at start; not a hybrid (its state moves a token a step)
        # every row's result is the same in any step (engine/ops/blas_order.py; checked by warm_up): reads
        # may share a step, end anywhere, and a cached prefix be reused at any block
        self.shape_free = False
        # keys one prompt step may hold in all (None: no limit): a q8_0 pool's prompt attention on the GPU
        # widens its sequences' rows to fp16 in a scratch the memory plan sized for one request's context
        self.step_keys = ctx if backend.name == "gpu" and self.kv.type.name == "q8_0" else None
        self.pooling = "unset"  # embeddings' (engine/runner/pooling.py): the file's or --pooling's, set at start

    def state_of(self, seq: Sequence) -> SequenceState | None:
        """seq's recurrent state (made at its first read), a hybrid model's; None for others."""
        if self.recurrent is not None and seq.state is None:
            seq.state = SequenceState.fresh(self.recurrent)
        return seq.state

    def info(self) -> dict[str, str]:
        return {"model": self.cfg.name, "path": self.model_path, "arch": self.cfg.arch,
                "ctx": str(self.ctx), "chunk": str(self.chunk), "device": self.backend.device_name,
                "vocab": str(self.vocab_size), "max_running": str(self.max_running),
                "kv_blocks": str(self.pool.total), "kv_block": str(self.pool.size),
                "kv_block_bytes": str(self.kv.block_bytes), "kv_type": self.kv.type.name,
                "cache_ram_blocks": str(self.pool.tier.capacity if self.pool.tier else 0),
                "shape_free": str(int(self.shape_free)),
                "state_bytes": str(0 if self.recurrent is None else 2 * self.recurrent.nbytes),  # a hybrid's state
                "version": __version__} | self.memory | (self.draft_model.info() if self.draft_model else {})

    def memory_report(self) -> str:
        """Where the GPU's memory is (engine/core/memory.py device_memory_report); on the CPU, nothing to say."""
        if self.backend.name != "gpu":
            return "host memory"
        return device_memory_report(self.backend.xp, {"recurrent states": self.state_memory and self.state_memory.pool,
                                                      "decode graphs": self.decoder and self.decoder.pool})

    def warm_up(self) -> None:
        """One small forward before READY, so the first request does not pay first-call costs
        (page faults on the weights, BLAS/CuPy initialization, kernel compilation, the first
        decode graph's capture, the sampling picks' kernels)."""
        table = self.pool.allocate(self.pool.blocks_for(9))  # 8 prompt positions and a decode step's
        state = None if self.recurrent is None else SequenceState.fresh(self.recurrent)
        self.forward(np.zeros(8, dtype=np.int64), 0, table, want_logits=True, state=state)
        logits = self.decode_logits([0], [table], [8], [state] if state else ())  # the one-row decode graph
        # (other batch sizes: at first use)
        self.picks.prepare(logits[0])  # (the GPU's sampling kernels compiled on a first start, and loaded)
        self.backend.synchronize()
        self.pool.release(table)
        self.shape_free = self.rows_invariant()

    def rows_invariant(self) -> bool:  # (tensor parallel's ranks say no: engine/parallel/tp_workers.py)
        return rows_invariant_said(self.model, self.backend)

    @property
    def layers(self) -> int:
        return self.cfg.n_layers

    def read_prompt_chunk(self, seq: Sequence, between: Callable[[int], None] | None = None) -> None:
        """The sequence's next prompt chunk; `between(i)` after each layer i but the last (see
        LlamaModel.forward)."""
        self.read_prompts([(seq, chunk_end(seq.pos, seq.total, self.chunk))], between)

    def read_prompts(self, pieces: list[tuple[Sequence, int]], between: Callable[[int], None] | None = None) -> None:
        """Each sequence's prompt from its position to the end given, in one forward (several only
        when shape_free); one that reaches its prompt's end gets its logits (an embed request: its rows
        pooled, engine/runner/pooling.py). A hybrid's read starts at its state's mark (read again)."""
        states = [self.state_of(seq) for seq, _ in pieces] if self.recurrent is not None else []
        for seq, state in zip((seq for seq, _ in pieces), states):
            seq.pos = state.rewind()
        starts = [seq.pos for seq, _ in pieces]
        wanting = [seq for seq, end in pieces if end == seq.total and not seq.settling and seq.pool is None]
        reads = [(np.asarray(seq.prompt[seq.pos : end], dtype=np.int64), seq.pos, seq.table, seq in wanting)
                 for seq, end in pieces]
        rows = hidden_rows(pieces)
        if self.shape_free:
            logits = take_hidden(pieces, rows, self.model.forward_reads(reads, self.kv, between, tuple(states), rows))
        else:  # one read a step: its chunk at absolute boundaries
            logits = take_hidden(pieces, rows, self.forward(*reads[0], between, pieces[0][0].state, rows))
            logits = None if logits is None else logits[None]
        for seq, _ in pieces:
            seq.logits = logits[wanting.index(seq)] if seq in wanting else None
            seq.graph_row = None
        self.backend.synchronize()  # a chunk is done when its PP says so: GPU launches are asynchronous,
        for seq, end in pieces:  # and a host running chunks ahead would make a park wait for all of them
            seq.pos = end
        for state, (_, end), start in zip(states, pieces, starts):
            state.read(start, end - start)

    def forward(self, tokens, start: int, table, want_logits: bool, between: Callable[[int], None] | None = None,
                state: SequenceState | None = None, hidden_rows: list[int] | None = None):
        """The model over `tokens` at positions start.. of the sequence whose blocks `table` lists
        (LlamaModel.forward), from its recurrent state (a hybrid's: at its mark, which the caller moves
        on): its K/V rows written, the last position's logits (and hidden_rows') left on the device."""
        rows = self.kv.rows(table, states=() if state is None else (state,))
        return self.model.forward(tokens, start, rows, want_logits, on_device=True, between=between,
                                  hidden_rows=hidden_rows)

    def synchronize(self) -> None:
        self.backend.synchronize()

    def close(self) -> None:
        """The engine is stopping: end what the runner started (nothing here)."""

    def constraint(self, grammar: str):
        """A request's grammar state (engine/runner/grammar_mask.py); ValueError if it does not compile."""
        return compile_constraint(self.grammars, grammar)

    def decode_batch(self, seqs: list[Sequence], meanwhile: Callable[[], None] | None = None) -> None:
        """One decode step for every sequence in `seqs` (each with blocks for its new rows): their
        newest tokens go through the model together, one pass over the weights; each gets its logits.
        A sequence's drafts (speculative decoding) go as decode rows of their own after its newest token's
        (the same bits as one-token steps); their logits are kept in order (draft_logits). Where the device runs
        the step while the host goes on (runs_async), the plain sampling rows' next tokens are drawn right behind
        it (Picks.behind: seq.picked) and meanwhile, the host's work, is done while it runs (decode_or_eager)."""
        states = [self.state_of(s) for s in seqs] if self.recurrent is not None else []
        tokens, tables, positions, first = decode_rows(seqs)
        behind = self.picks.behind(seqs, first) if self.runs_async else None
        logits = self.decode_logits(tokens, tables, positions, states, after_launch(behind, meanwhile))
        for state in states:
            state.decoded()
        graph = self.decoder is not None and self.decoder.owns(logits[0])
        for i, seq in zip(first, seqs):
            seq.logits, seq.graph_row = logits[i], i if graph else None
            seq.draft_logits = [logits[i + 1 + j] for j in range(len(seq.drafts))]
        if behind is not None:
            behind.collect()

    def decode_logits(self, tokens: list[int], tables: list[list[int]], positions: list[int], states=(),
                      meanwhile: Callable[[object], None] | None = None):
        """Logits (rows, vocab) after each row's token at its position, its rows in the blocks of its
        table (and its recurrent state, a hybrid's), on the backend's device: a graph replay on the GPU
        (valid until the next replay), else eager. Expert caches then refill from the step's routes."""
        logits, self.decoder = decode_or_eager(self.decoder, self.model, self.kv, tokens, tables, positions, states,
                                               meanwhile)
        for cache in self.expert_caches:
            cache.refill(len(tokens))
        return logits

    def set_aside(self, seq: Sequence) -> None:
        """A request leaves the decode graph's output buffer with its next token still to draw (paused for memory,
        or in an earlier forward of a step of several): Picks.set_aside."""
        self.picks.set_aside(seq)

    def snapshot_nbytes(self, seq: Sequence) -> int:
        """What a park's rows take in host memory (on a GPU a hybrid's recurrent state too: `spill`)."""
        return self.kv.snapshot_nbytes(seq.pos) + (0 if seq.state is None or self.backend.xp is np
                                                   else 2 * self.recurrent.nbytes)

    def park(self, seq: Sequence) -> None:
        """A read parks in place: its rows stay in its blocks, nothing is copied."""

    def spill(self, seq: Sequence) -> KVSnapshot:
        """A request's rows [0, rows) copied out of its blocks into host memory (the loop then
        gives the blocks back), and on a GPU a hybrid's recurrent state with them."""
        snap = self.kv.snapshot(seq.table, seq.rows)
        seq.state = seq.state and seq.state.on(np)  # a hybrid's recurrent state to host memory too
        self.backend.synchronize()
        return snap

    def restore(self, seq: Sequence, snap: KVSnapshot) -> None:
        """Rows spilled by `spill` copied back into the sequence's (new) blocks."""
        self.kv.restore(seq.table, snap)
        seq.state = seq.state and seq.state.on(self.backend.xp)
        self.backend.synchronize()  # so that the park's reported cost includes the copy back

    def fingerprint(self, seq: Sequence) -> str:
        return fingerprint(self.kv, seq)


def after_launch(behind: DrawsBehind | None, meanwhile: Callable[[], None] | None) -> Callable[[object], None] | None:
    """What a decode step does once its forward is launched (decode_or_eager's meanwhile, given the step's logits on
    the stream computing them): the draws behind it queued, then the host's work; None where there is neither."""
    if behind is None and meanwhile is None:
        return None

    def launched(logits) -> None:
        if behind is not None:
            behind.launch(logits)
        if meanwhile is not None:
            meanwhile()
    return launched


def fingerprint(kv: KVCache, seq: Sequence) -> str:
    """A request's state in 32 hex digits: its K/V rows, length, recurrent state (a hybrid's) and sampler."""
    h = hashlib.blake2b(digest_size=16)
    h.update(kv.digest(seq.table, seq.kv_len))
    h.update(seq.kv_len.to_bytes(8, "little"))
    if seq.state is not None:  # a hybrid's recurrent state after its last position
        h.update(seq.state.now.digest())
    h.update(seq.sampler.state_digest())
    return h.hexdigest()


def decode_rows(seqs: list[Sequence]) -> tuple[list[int], list, list[int], list[int]]:
    """A decode step's rows: each sequence's newest token, then its drafts at the positions after it ->
    (tokens, tables, positions, each sequence's first row)."""
    tokens, tables, positions, first = [], [], [], []
    for s in seqs:
        first.append(len(tokens))
        for i, token in enumerate([s.generated[-1], *s.drafts]):
            tokens.append(token)
            tables.append(s.table)
            positions.append(s.kv_len + i)
    return tokens, tables, positions, first
