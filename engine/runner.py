"""ModelRunner: the model, its KV cache and the backend, behind the interface the loop drives."""
from __future__ import annotations

import hashlib
import sys

import numpy as np

from engine import __version__
from engine.backend import Backend
from engine.decode_graph import GraphDecoder
from engine.draw_graph import DrawGraphs
from engine.gguf_model import ModelConfig, Weights
from engine.kv import KVCache, KVSnapshot
from engine.model import LlamaModel
from engine.prefill import chunk_end
from engine.sequence import Sequence


class ModelRunner:
    def __init__(self, cfg: ModelConfig, weights: Weights, backend: Backend, ctx: int, chunk: int,
                 eos_ids: frozenset[int], model_path: str = "", memory: dict[str, str] | None = None,
                 cuda_graphs: bool = True):
        self.cfg, self.backend, self.ctx, self.chunk = cfg, backend, ctx, chunk
        self.memory = memory or {}
        self.model = LlamaModel(cfg, weights, backend)
        self.kv = KVCache(cfg, ctx, backend)
        self.decoder = GraphDecoder(self.model, self.kv, backend) if cuda_graphs and backend.name == "gpu" else None
        self.draws = DrawGraphs(backend.xp) if self.decoder is not None else None
        self.eos_ids, self.vocab_size, self.model_path = eos_ids, cfg.vocab_size, model_path
        self.grammars = None  # engine/grammar.py GrammarTokenizer, set once the tokenizer is read

    def info(self) -> dict[str, str]:
        return {"model": self.cfg.name, "path": self.model_path, "arch": self.cfg.arch,
                "ctx": str(self.ctx), "chunk": str(self.chunk), "device": self.backend.device_name,
                "vocab": str(self.vocab_size), "version": __version__} | self.memory

    def warm_up(self) -> None:
        """One small forward before READY, so the first request does not pay first-call costs
        (page faults on the weights, BLAS/CuPy initialization, kernel compilation, the first
        decode graph's capture)."""
        self.model.forward(np.zeros(8, dtype=np.int64), 0, self.kv, want_logits=True)
        self.decode_logits(0, 8)
        self.backend.synchronize()

    def read_prompt_chunk(self, seq: Sequence) -> None:
        end = chunk_end(seq.pos, seq.total, self.chunk)
        tokens = np.asarray(seq.prompt[seq.pos : end], dtype=np.int64)
        seq.logits = self.model.forward(tokens, seq.pos, self.kv, want_logits=end == seq.total, on_device=True)
        self.backend.synchronize()  # a chunk is done when its PP says so: GPU launches are asynchronous,
        seq.pos = end  # and a host running chunks ahead would make a park wait for all of them

    def constraint(self, grammar: str):
        """A request's grammar state (engine/grammar.py); ValueError if it does not compile."""
        if self.grammars is None:
            raise ValueError("this engine has no tokenizer for grammars")
        try:
            return self.grammars.constraint(grammar)
        except Exception as e:  # whatever llguidance raises on a grammar it cannot take: an ERR, not a crash
            raise ValueError(f"grammar: {e}") from None

    def decode_one_token(self, seq: Sequence) -> None:
        seq.logits = self.decode_logits(seq.generated[-1], seq.kv_len)

    def sample(self, seq: Sequence) -> int:
        """The next token from the logits where they are (the GPU samples on the device). After a
        decode graph's replay a plain greedy pick is the argmax the graph computed, and a
        temperature draw replays a captured draw (engine/draw_graph.py)."""
        if self.decoder is not None and self.decoder.owns(seq.logits):
            if seq.sampler.plain_greedy:
                return self.decoder.greedy_token()
            return seq.sampler.sample(seq.logits, self.backend.xp, self.draws)
        return seq.sampler.sample(seq.logits, self.backend.xp)

    def decode_logits(self, token: int, pos: int):
        """Logits (vocab,) after `token` at position `pos`, on the backend's device: a graph replay on
        the GPU (valid until the next replay), else eager."""
        if self.decoder is not None:
            try:
                return self.decoder.decode(token, pos)
            except Exception as e:  # a capture the driver refuses: decode eagerly from now on
                print(f"strata: CUDA graph decode unavailable ({type(e).__name__}: {e}); decoding eagerly",
                      file=sys.stderr, flush=True)
                self.decoder = None
        return self.model.forward(np.asarray([token], dtype=np.int64), pos, self.kv, want_logits=True, on_device=True)

    def snapshot_nbytes(self, seq: Sequence) -> int:
        return self.kv.snapshot_nbytes(seq.pos)

    def park(self, seq: Sequence) -> KVSnapshot:
        snap = self.kv.snapshot(seq.pos)
        self.backend.synchronize()
        return snap

    def restore(self, seq: Sequence, snap: KVSnapshot) -> None:
        self.kv.restore(snap)
        self.backend.synchronize()  # so that the park's reported cost includes the copy back

    def fingerprint(self, seq: Sequence) -> str:
        h = hashlib.blake2b(digest_size=16)
        h.update(self.kv.digest(seq.kv_len))
        h.update(seq.kv_len.to_bytes(8, "little"))
        h.update(seq.sampler.state_digest())
        return h.hexdigest()
