"""Which compilations (build.Unit) a model needs: the parts of quant.cu and mmq.cu that hold its weights'
kinds, the parts of attention.cu that hold its head size's prompt kernel and its grouping's decoding
kernels, moe.cu only for a mixture of experts, linear_attention.cu only for a hybrid. A first start compiles
these alone (11 of 68 parts for a Llama-3-8B in Q4_K_M), each short, so that it waits for one round of short compilations side by side; a
kernel outside them is built when first asked for (engine/kernels/loader.py's load_rest), which a model's
own steps never do.

The parts' contents are fixed by the IN_PART(j) lines of the .cu files (parts.cuh); the layout below
mirrors them, and tests/engine/kernels/test_model_parts.py checks it against the preprocessed sources."""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from engine.core.quantized import BLOCKS
from engine.kernels.attention_launch import HEAD_DIMS, MAX_GROUP, decode_group
from engine.kernels.build import PARTS, Unit
from engine.kernels.matvec_launch import SBQ_KINDS, sbq_wanted
from engine.modelfile.gguf_file import GGUFFile
from engine.modelfile.model_config import ModelConfig

KIND_PART = {kind: i for i, kind in enumerate(BLOCKS)}  # mmq.cu: part i holds BLOCKS' i-th kind; quant.cu: parts
# 2i (its matvecs of 1-8 rows, dequant_, embed_, its pair with Q6_K but the IQ types') and 2i + 1 (its matvecs of
# 9-16 rows)
FP16_PART = 2 * len(BLOCKS) - 1  # quant.cu: the F16 weights' dequant_ and embed_ kernels share the last part
HEAD_DIM_PARTS = 1 + MAX_GROUP  # attention.cu: per head size, a part for its prompt kernel, then one per group
ALWAYS = ("norm_rope.cu", "argmax.cu", "mmv.cu")  # small, and every model's (mmv: its fp16 matrices)


@dataclass(frozen=True)
class ModelKernels:
    """What of a model decides its kernels: the GGUF types of its matrices, the head size, the query
    heads per K/V head, whether its feed-forward is a mixture of experts, whether it has linear-attention
    layers (a hybrid's)."""

    kinds: frozenset[str]
    head_dim: int
    group: int
    moe: bool = False
    hybrid: bool = False
    sbq: bool = False  # sbq.cu for its Q4_K and Q6_K matrices ($STRATA_SBQ=1: sbq_wanted)
    beside: tuple["ModelKernels", ...] = ()  # other models the engine runs on the same kernels (a draft model's):
    # their parts are built at start too (one asked for later, once the KV pool holds the card, is built by
    # load_rest's compiler processes, whose CUDA contexts then find no memory)

    @classmethod
    def of(cls, cfg: ModelConfig, reader: GGUFFile) -> ModelKernels:
        kinds = frozenset(t.tensor_type.name for t in reader.tensors if len(t.shape) >= 2)
        return cls(kinds, cfg.head_dim, max(1, cfg.n_heads // max(1, cfg.n_kv_heads)), cfg.n_experts > 0,
                   cfg.hybrid is not None, sbq_wanted())

    @cached_property
    def parts(self) -> dict[str, set[int]]:
        """Each kernel file this model needs -> the parts of it (0 for a file built whole)."""
        quantized = {KIND_PART[k] for k in self.kinds if k in KIND_PART}
        wanted = {source: {0} for source in ALWAYS}
        # quant.cu: the kinds' parts; the last for fp16 matrices (and for a model with no quantized kind: every
        # part has quantize_q8 and dequant_BF16)
        wanted["quant.cu"] = ({part for i in quantized for part in (2 * i, 2 * i + 1)}
                              | ({FP16_PART} if self.kinds - KIND_PART.keys() or not quantized else set()))
        if quantized:
            wanted["mmq.cu"] = quantized
        if self.sbq and self.kinds & set(SBQ_KINDS):
            wanted["sbq.cu"] = {0}
        if self.moe:
            wanted["moe.cu"] = {0}
        if self.hybrid:
            wanted["linear_attention.cu"] = {0}
        if self.head_dim in HEAD_DIMS and 1 <= self.group <= MAX_GROUP:
            first = HEAD_DIM_PARTS * HEAD_DIMS.index(self.head_dim)
            wanted["attention.cu"] = {first, first + decode_group(self.group, self.head_dim)[0]}
        else:  # a head size no kernel has: every part, and the launcher says what is missing
            wanted["attention.cu"] = set(range(PARTS["attention.cu"]))
        return wanted

    def wants(self, unit: Unit) -> bool:
        """Whether a first start builds this compilation for this model (or one beside it)."""
        return unit.part in self.parts.get(unit.source, ()) or any(model.wants(unit) for model in self.beside)
