"""Which compilations (build.Unit) a model needs: the parts of quant.cu and mmq.cu that hold its weights'
kinds, the part of attention.cu that holds its head size and grouping, moe.cu only for a mixture of
experts. A first start compiles these alone (8 of 24 parts for a Llama-3-8B in Q4_K_M), so that it waits
for one round of compilations side by side, not two; a kernel outside them is built when first asked for
(engine/kernels/loader.py's load_rest), which a model's own steps never do.

The parts' contents are fixed by the IN_PART(j) lines of the .cu files (parts.cuh); the layout below
mirrors them, and tests/engine/kernels/test_model_parts.py checks it against the preprocessed sources."""
from __future__ import annotations

from dataclasses import dataclass

from engine.core.quantized import BLOCKS
from engine.kernels.attention_launch import HEAD_DIMS
from engine.kernels.build import PARTS, Unit
from engine.modelfile.gguf_file import GGUFFile
from engine.modelfile.model_config import ModelConfig

KIND_PART = {kind: i for i, kind in enumerate(BLOCKS)}  # quant.cu and mmq.cu: part i holds BLOCKS' i-th kind
FP16_PART = len(BLOCKS) - 1  # quant.cu: the F16 weights' dequant_ and embed_ kernels share the last part
GROUPS_PER_PART = 4  # attention.cu: a head size's flash_decode kernels for groups 1-4 in one part, 5-8 the next
ALWAYS = ("norm_rope.cu", "argmax.cu", "mmv.cu")  # small, and every model's (mmv: its fp16 matrices)


@dataclass(frozen=True)
class ModelKernels:
    """What of a model decides its kernels: the GGUF types of its matrices, the head size, the query
    heads per K/V head, whether its feed-forward is a mixture of experts."""

    kinds: frozenset[str]
    head_dim: int
    group: int
    moe: bool = False

    @classmethod
    def of(cls, cfg: ModelConfig, reader: GGUFFile) -> ModelKernels:
        kinds = frozenset(t.tensor_type.name for t in reader.tensors if len(t.shape) >= 2)
        return cls(kinds, cfg.head_dim, max(1, cfg.n_heads // max(1, cfg.n_kv_heads)), cfg.n_experts > 0)

    def parts(self) -> dict[str, set[int]]:
        """Each kernel file this model needs -> the parts of it (0 for a file built whole)."""
        quantized = {KIND_PART[k] for k in self.kinds if k in KIND_PART}
        wanted = {source: {0} for source in ALWAYS}
        # quant.cu: the kinds' parts; the last for fp16 matrices (and for a model with no quantized kind: every
        # part has quantize_q8 and dequant_BF16)
        wanted["quant.cu"] = quantized | ({FP16_PART} if self.kinds - KIND_PART.keys() or not quantized else set())
        if quantized:
            wanted["mmq.cu"] = quantized
        if self.moe:
            wanted["moe.cu"] = {0}
        if self.head_dim in HEAD_DIMS:  # the prompt kernel sits in the groups 1-4 part
            first = 2 * HEAD_DIMS.index(self.head_dim)
            wanted["attention.cu"] = {first} | ({first + 1} if self.group > GROUPS_PER_PART else set())
        else:  # a head size no kernel has: every part, and the launcher says what is missing
            wanted["attention.cu"] = set(range(PARTS["attention.cu"]))
        return wanted

    def wants(self, unit: Unit) -> bool:
        """Whether a first start builds this compilation for this model."""
        return unit.part in self.parts().get(unit.source, ())
