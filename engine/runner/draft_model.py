"""Drafts from a smaller model of the target's vocabulary (speculative decoding's second drafter, issue 47:
`--speculative draft --draft FILE`). The draft model only proposes: its tokens go through the target's
decode step as any drafter's do (engine/loop/decode_steps.py), so what it proposes changes how many are
kept, never the output.

DraftModel holds the draft's weights (LlamaModel over them on the target's backend: the CPU, or the target's
GPU, where the memory plan counts its weights and its pool beside the target's, and its draft steps are decode
graphs of its own, as the target's) and a KV pool of its own: blocks of the target's block size and cache type
(--kv-type), as many positions as the target's pool, handed out from a free list (no prefix cache: a draft's rows
serve only its own proposals). Each request it drafts for has a ModelDrafter: its block table there and `filled`,
how many of its context's tokens have rows in it. One call a decode step, propose(), drafts for all of them: each
request's rows are caught up from `filled` to the token before its newest (a chunk at most a step, at absolute
boundaries: a long prompt's catch-up never holds the decoders for long; it drafts once caught up), then k greedy
steps, each one batched forward over the requests still drafting (row i: its newest token, then its latest draft;
none drafts past a token that would end it). A request whose blocks cannot be had gets fewer drafts, or none, that
step. Its rows go back to the free list when it ends or leaves the pool (paused, a parked read moved out):
they are read again at its next draft."""
from __future__ import annotations

import os
import time

import numpy as np

from engine.core.chunks import chunk_end
from engine.kvcache.kv import KVCache
from engine.model.forward import LlamaModel
from engine.model.layer_weights import Weights
from engine.model.weights import load_model
from engine.modelfile.gguf_file import GGUFFile
from engine.modelfile.model_config import ModelConfig, ModelLoadError, field_value, read_config
from engine.ops.backend import Backend
from engine.runner.decode_graph import GraphDecoder, decode_or_eager
from engine.runner.draft_pace import DraftPace
from engine.runner.sequence import Sequence

MAX_EXTRA_TOKENS = 128  # a draft's token list may be this much longer or shorter than the target's (a head
# padded past the vocabulary: Qwen2.5's 0.5B has 151,936 rows, its 7B 152,064), as llama.cpp allows


def vocabulary_refusal(target: GGUFFile, draft: GGUFFile) -> str | None:
    """Why the draft's tokens are not the target's (None if they are, where both files have them)."""
    ours, theirs = field_value(target, "tokenizer.ggml.tokens") or [], field_value(draft, "tokenizer.ggml.tokens") or []
    if abs(len(ours) - len(theirs)) > MAX_EXTRA_TOKENS:
        return f"{len(theirs)} tokens, the target {len(ours)}"
    differ = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), None)
    if differ is not None:
        return f"token {differ} is {theirs[differ]!r}, the target's {ours[differ]!r}"
    for key in ("eos", "bos"):
        mine, other = (field_value(f, f"tokenizer.ggml.{key}_token_id") for f in (target, draft))
        if mine != other:
            return f"its {key} token is {other}, the target's {mine}"
    return None


def open_draft(path: str, target: GGUFFile, backend_name: str, tp: int = 1, opened: GGUFFile | None = None
               ) -> GGUFFile:
    """The draft's file, checked before anything loads: a model of the target's vocabulary, a dense one
    (not a hybrid), for a dense target, on one GPU or the CPU (ModelLoadError or ValueError saying why not).
    opened: the file at `path` already read (else read here)."""
    if read_config(target).hybrid:
        raise ValueError("--speculative draft is not for the hybrid families in this version (their recurrent state "
                         "moves a token a step)")
    if backend_name != "cpu" and tp > 1:
        raise ValueError("--speculative draft runs on one GPU (--tp 1) in this version")
    if not os.path.isfile(path):
        raise ModelLoadError(f"--draft {path}: no such file")
    draft = opened or GGUFFile(path, "r")
    if read_config(draft).hybrid:
        raise ModelLoadError(f"--draft {path}: a hybrid model cannot draft in this version (its state is per request)")
    if (why := vocabulary_refusal(target, draft)) is not None:
        raise ModelLoadError(f"--draft {path}: its vocabulary is not the target's ({why}); a draft model must "
                             "share the target's tokenizer")
    return draft


class DraftModel:
    def __init__(self, path: str, cfg: ModelConfig, weights: Weights, backend: Backend, ctx: int, chunk: int,
                 block_size: int, positions: int, tokens: int, kv_type: str = "auto", graphs: bool = False):
        """ctx, chunk, block_size, kv_type: the target's; positions: the pool's (the target pool's by default);
        tokens: the ids a draft may be (those both files name); graphs: its steps as decode-graph replays (a GPU's,
        as the target's: an eager forward of a small model is its kernels' launches, several times its work)."""
        self.path, self.cfg, self.backend, self.ctx, self.chunk, self.tokens = path, cfg, backend, ctx, chunk, tokens
        self.model = LlamaModel(cfg, weights, backend)
        self.model.rope_tables(ctx + 1)  # every position the target reaches, past the draft's trained context too
        self.kv = KVCache(cfg, ctx, backend, block_size, blocks=-(-positions // block_size), kv_type=kv_type,
                          spare=int(graphs))  # (a spare block past the pool: the graphs' padding rows write there)
        self.free: list[int] = list(range(self.kv.usable))  # blocks no request holds
        self.graphs = GraphDecoder(self.model, self.kv, backend, self.kv.usable) if graphs else None
        self.step_seconds: float | None = None  # a draft forward's time, as measured (draft_steps)
        self.size_ratio = 1.0  # its file's bytes against the target's: a draft forward's cost until measured (load)

    @classmethod
    def load(cls, reader: GGUFFile, runner, loaded: tuple[ModelConfig, Weights] | None = None) -> "DraftModel":
        """The draft from its checked file (open_draft) for this runner's target; `loaded`: its config and weights
        if they are loaded already (the target's own, when the draft is the target's file; a GPU's, loaded before
        the memory plan), else loaded here (float32, on the CPU)."""
        cfg, weights = loaded or load_model(reader.path, runner.backend, keep_blocks=False, reader=reader)[:2]
        tokens = min(len(field_value(reader, "tokenizer.ggml.tokens")), cfg.vocab_size, runner.vocab_size)
        model = cls(str(reader.path), cfg, weights, runner.backend, runner.ctx, runner.chunk, runner.pool.size,
                    runner.pool.total * runner.pool.size, tokens, runner.kv.type.name, runner.decoder is not None)
        model.size_ratio = os.path.getsize(reader.path) / max(1, os.path.getsize(runner.model_path))
        return model

    def drafter(self, context, most: int) -> "ModelDrafter":
        return ModelDrafter(self, context, most)

    def info(self) -> dict[str, str]:
        return {"draft": self.cfg.name, "draft_path": self.path, "draft_layers": str(self.cfg.n_layers),
                "draft_blocks": str(self.kv.usable), "draft_block_bytes": str(self.kv.block_bytes)}

    # ------------------------------------------------------------ a step's drafts

    def propose(self, seqs: list[Sequence], cost: float) -> None:
        """Drafts for these requests (each with a ModelDrafter), left in their drafters for the decode step
        to take (ModelDrafter.propose): as many as each one's pace (at `cost` a drafted token), answer and
        context allow."""
        going = []  # (drafter, its k, the tokens that would end it)
        for seq in seqs:
            d = seq.drafter
            d.ready = []
            k = self.room(d, min(d.budget(cost), seq.draft_room(self.ctx)))
            if k > 0 and self.catch_up(d):
                going.append((d, k, seq.stop_ids))
        self.draft_steps(going)

    def room(self, d: "ModelDrafter", k: int) -> int:
        """k, or fewer where the free blocks cannot hold the rows k drafts write (the newest token's and
        each draft's but the last: positions [0, newest + k)), d's table grown to hold them; 0 if not one."""
        newest = len(d.context) - 1
        k = min(k, (len(d.table) + len(self.free)) * self.kv.block_size - newest)
        if k > 0:
            for _ in range(self.kv.blocks_for(newest + k) - len(d.table)):
                d.table.append(self.free.pop())
        return max(k, 0)

    def catch_up(self, d: "ModelDrafter") -> bool:
        """d's rows read up to its newest token's (not included), a chunk at most: whether all are there."""
        newest = len(d.context) - 1
        start = min(d.filled, newest)
        if start < newest:
            end = chunk_end(start, newest, self.chunk)
            tokens = np.asarray(d.context[start:end], dtype=np.int64)  # (end - start,)
            self.model.forward(tokens, start, self.kv.rows(d.table), want_logits=False)
            start = end
        d.filled = start
        return start == newest

    def draft_steps(self, going: list[tuple["ModelDrafter", int, frozenset[int]]]) -> None:
        """Greedy steps, each one batched forward over the requests still drafting (up to k drafts each, none
        after one that would end it), the draft's likeliest token its next draft. Their newest tokens' rows
        are there after it (`filled`)."""
        drafting, started, steps = going, time.perf_counter(), 0
        while drafting:
            steps += 1
            tokens = [d.ready[-1] if d.ready else d.context[-1] for d, _, _ in drafting]
            positions = [len(d.context) - 1 + len(d.ready) for d, _, _ in drafting]
            logits, self.graphs = decode_or_eager(self.graphs, self.model, self.kv, tokens,  # (rows, vocab), a graph's
                                                  [d.table for d, _, _ in drafting], positions)  # until its next replay
            picks = self.backend.to_host(logits[:, : self.tokens].argmax(axis=-1))  # (rows,)
            for (d, _, _), token in zip(drafting, picks.tolist()):
                d.ready.append(int(token))
            drafting = [(d, k, stops) for d, k, stops in drafting if len(d.ready) < k and d.ready[-1] not in stops]
        for d, _, _ in going:
            d.filled, d.written = len(d.context), len(d.context) - 1 + len(d.ready)
        if steps:  # (its forwards' mean, recent ones weighing more: the pace adds it to a drafted token's cost)
            mean = (time.perf_counter() - started) / steps
            self.step_seconds = mean if self.step_seconds is None else 0.8 * self.step_seconds + 0.2 * mean

    def give_back(self, d: "ModelDrafter") -> None:
        """d's blocks back to the free list (its rows are read again at its next draft)."""
        self.free.extend(d.table)
        d.table, d.filled, d.written, d.ready = [], 0, 0, []


class ModelDrafter(DraftPace):
    """One request's drafts from the draft model: its context, its rows in the draft's pool."""

    def __init__(self, model: DraftModel, context, most: int):
        super().__init__(most)
        self.model = model
        self.context: list[int] = [int(t) for t in context]  # the prompt, then every token drawn (the newest last)
        self.table: list[int] = []  # its blocks in the draft's pool, in position order
        self.filled = 0  # context tokens whose rows are in those blocks
        self.written = 0  # rows the latest draft steps wrote: up to and including its latest draft's input
        self.ready: list[int] = []  # the latest DraftModel.propose's drafts

    def extend(self, tokens) -> None:
        """Tokens appended to the context (each accepted draft or drawn token)."""
        self.context.extend(int(t) for t in tokens)

    def propose(self, cost: float) -> list[int]:
        """The drafts DraftModel.propose made for this step ([] if none; their pace was set there)."""
        drafts, self.ready = self.ready, []
        return drafts

    def verified(self, proposed: int, accepted: int) -> None:
        super().verified(proposed, accepted)
        self.filled = min(self.filled + accepted, self.written)  # a kept draft's row is the context's own

    def release(self) -> None:
        """Its draft rows back to the pool (it ends, or its target rows leave the pool)."""
        self.model.give_back(self)
