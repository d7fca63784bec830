"""The kernels GpuKernels builds, by source file, and their loading: CuPy's modules of each file's
parts (build.py) or, for the Hopper prompt attention, the sm_90a module (sm90.py); each kernel's
shared-memory cap; the decode step's kernels wrapped for programmatic dependent launch (launch.py)."""
from __future__ import annotations

import sys
from concurrent.futures import ThreadPoolExecutor
from types import ModuleType
from typing import TYPE_CHECKING

from engine.core.quantized import BLOCKS
from engine.kernels import build, launch, moe_launch, sm90
from engine.kernels.attention_launch import (HEAD_DIMS, PROMPT_ATTENTION, SM90_HEAD_DIMS, attention_smem_bytes,
                                            decode_kernel_groups)
from engine.kernels.dequant_launch import WEIGHT_KINDS
from engine.kernels.linear_attention_launch import CONV_KERNELS, SCAN_WIDTHS
from engine.kernels.matvec_launch import (MATVEC_PAIRS, MATVEC_STAGE_MAX, MAX_BATCH_ROWS, MMQ_TILES, MMV_TILE_ROWS,
                                          SBQ_KINDS, SBQ_TILES, mmq_smem_bytes)
from engine.kernels.sources import OPTIONS, kernel_source

if TYPE_CHECKING:
    from engine.kernels.model_parts import ModelKernels


MMQ_SMEM_CAP = max(mmq_smem_bytes(kind, nt) for kind in BLOCKS for nt in MMQ_TILES)  # any mmq kernel's
ATTENTION_SMEM = {f"flash_attention_d{d}": attention_smem_bytes(d) for d in HEAD_DIMS}  # the prompt kernels'


def built_kernels() -> dict[str, tuple[str, ...]]:
    """The kernels GpuKernels builds (compiled by CuPy), by source file."""
    return {"norm_rope.cu": ("add_rms_norm", "add_gated_rms_norm", "rope_store", "norm_rope_store", "silu_mul"),
             "argmax.cu": ("argmax_first", "pick_keys", "pick_top", "pick_draw", "row_logprobs"),
             "quant.cu": ("dequant_BF16", "quantize_q8", *(f"{family}_{kind}{suffix}" for kind in WEIGHT_KINDS
                                            for family, suffix in (("dequant", ""), ("embed", ""))),
                          *(f"matvec_{kind}_n{nb}{suffix}" for kind in BLOCKS
                            for nb in range(1, MAX_BATCH_ROWS + 1) for suffix in ("", "_f32")),
                          *(f"matvec2_{a}_{b}" for a, b in MATVEC_PAIRS),
                          *(f"matvec_{fused}_{kind}" for kind in BLOCKS for fused in ("act", "norm"))),
             "attention.cu": (*(f"flash_attention_d{d}" for d in HEAD_DIMS), "widen_q8_0_blocks",
                              *(f"flash_decode{kind}_d{d}_g{g}" for kind in ("", "_q8") for d in HEAD_DIMS
                                for g in decode_kernel_groups(d))),
             "mmv.cu": tuple(f"mmv_f16_t{nt}{suffix}" for nt in MMV_TILE_ROWS for suffix in ("", "_f32")),
             "mmq.cu": tuple(f"mmq_{kind}_t{nt}{suffix}" for kind in BLOCKS for nt in MMQ_TILES for suffix in ("", "_f32")),
             "sbq.cu": ("quantize_q8k", "sbq_sum_parts", "sbq_sum_parts_f32",
                        *(f"sbq_{kind}_{v}{suffix}" for kind in SBQ_KINDS
                          for v in ("n1", *(f"t{nt}" for nt in SBQ_TILES)) for suffix in ("", "_f32"))),
             "moe.cu": moe_launch.KERNELS,
             "linear_attention.cu": ("sigmoid_mul",
                                     *(f"conv_{part}_k{k}" for k in CONV_KERNELS for part in ("rows", "window")),
                                     *(f"{name}{d}" for d in SCAN_WIDTHS
                                       for name in ("delta_prep_d", "delta_chunks_d", "l2_heads_d", "gated_norm_d",
                                                    "delta_norm_k", *(f"conv_l2_k{k}_d" for k in CONV_KERNELS))))}


def find_function(modules, name: str):
    """The kernel `name` from the first of a file's parts that has it (parts.cuh); None if none has."""
    for module in modules:
        try:
            return module.get_function(name)
        except Exception:  # CuPy's error for a name this part does not hold: the next part
            continue
    return None


class KernelTable(dict):
    """Kernel name -> function. A name not loaded (a part the model was not expected to need) is built
    and loaded at its first use by `load_rest`, then found like the others."""

    def __init__(self, load_rest):
        super().__init__()
        self.load_rest = load_rest

    def __missing__(self, name: str):
        self.load_rest(name)
        if name not in self:
            raise KeyError(f"no kernel {name!r} in engine/kernels")
        return dict.__getitem__(self, name)


def is_dependent(kernel: str) -> bool:
    """Whether a kernel waits for its producers in after_producer() (pdl.cuh) before it reads or
    writes anything, so that a decode graph may launch it while the kernel before it runs: every
    kernel of a decode step (tests/engine/test_kernel_sources.py checks their sources); not the
    prompt chunks' attention."""
    return not kernel.startswith("flash_attention")


class KernelLoader:
    """Mixed into GpuKernels, which sets what these read: cp (CuPy). Fills fn (kernel name -> function)."""

    cp: ModuleType
    fn: KernelTable

    def load_modules(self, defines: tuple[str, ...], model: ModelKernels | None = None,
                     prompt_attention: str | None = None) -> None:
        """Starts building the kernels of built_kernels() that `model` needs (model_parts.py; every kernel
        without one) and returns: the parts not yet in the cache are compiled side by side (build.prebuild),
        with the sm_90a prompt attention's cubin unless prompt_attention is "mma", in a thread, while the
        caller goes on (a first start uploads the weights meanwhile). ready() waits for the build and loads
        the kernels into fn; a kernel asked for before then waits there too (KernelTable)."""
        if prompt_attention not in (None, *PROMPT_ATTENTION):
            raise ValueError(f"prompt attention kernel {prompt_attention!r}: choose one of {PROMPT_ATTENTION}")
        self.defines, self.loaded, self.hopper = defines, set(), None
        self.fn = KernelTable(self.load_rest)
        todo = [unit for unit in build.units(built_kernels()) if model is None or model.wants(unit)]
        extra = [build.SM90] if prompt_attention != "mma" and sm90.supported(self.cp) else []
        builder = ThreadPoolExecutor(1, thread_name_prefix="kernel-build")
        self.building = builder.submit(build.prebuild, self.cp, todo + extra, defines)
        builder.shutdown(wait=False)  # its thread ends with the build
        self.pending = (todo, prompt_attention)

    def ready(self) -> None:
        """The build load_modules started finished (its error raised here) and its kernels in fn, prepared;
        the prompt attention chosen. Once; later calls return at once."""
        if self.pending is None:
            return
        todo, wanted = self.pending
        self.building.result()
        self.pending = None
        self.load_units(todo)
        self._prompt_attention = self.load_sm90(self.defines, wanted)
        self.prepare_functions(int(self.cp.cuda.Device().compute_capability) >= 90)

    @property
    def prompt_attention(self) -> str:
        """ "sm90" or "mma": the prompt chunks' attention kernel (load_sm90), known once ready()."""
        self.ready()
        return self._prompt_attention

    @prompt_attention.setter
    def prompt_attention(self, kind: str) -> None:  # a tool's way to time or check the other kernel
        self.ready()
        self._prompt_attention = kind

    def load_units(self, todo: list[build.Unit]) -> None:
        """Each kernel the units hold into fn (prepared, once prepare_functions has run)."""
        for source, kernels in built_kernels().items():
            parts = [build.module(self.cp, unit, self.defines) for unit in todo if unit.source == source]
            for name in kernels if parts else ():
                if name not in self.fn and (found := find_function(parts, name)) is not None:
                    self.fn[name] = found if self.hopper is None else self.prepared(name, found)
        self.loaded |= set(todo)

    def load_rest(self, name: str) -> None:
        """The parts of `name`'s file not yet loaded, compiled (side by side where the card has room for the
        compilers' contexts) and loaded: `name` was asked for and is in none of the model's parts (model_parts.py
        did not foresee it; said in the log). Asked for before ready():
        ready() first, which loads the model's parts."""
        if self.pending is not None:
            self.ready()
            if name in self.fn:
                return
        kernels = built_kernels()  # (the names of every file's kernels, made anew each call)
        sources = [source for source, names in kernels.items() if name in names] or list(kernels)
        rest = [unit for unit in build.units(kernels) if unit not in self.loaded and unit.source in sources]
        if rest:
            build.log(f"kernel {name} is outside the parts built for this model: loading the other {len(rest)} of "
                      f"{', '.join(sources)}")
            build.prebuild(self.cp, rest, self.defines, build.workers_beside(self.cp))
            self.load_units(rest)

    def load_sm90(self, defines: tuple[str, ...], wanted: str | None) -> str:
        """The prompt-attention kernel to use: "sm90" once attention_sm90.cu is built (compute
        capability 9.0 only), else "mma". A device that has it but cannot build it (an NVRTC older
        than CUDA 12) says so and runs the mma.sync kernel."""
        if wanted == "mma" or not sm90.supported(self.cp):
            if wanted == "sm90":
                raise ValueError("the sm90 attention kernel needs a GPU of compute capability 9.0 (Hopper)")
            return "mma"
        names = tuple(f"flash_attention_sm90_d{d}" for d in SM90_HEAD_DIMS)
        try:
            built = sm90.Sm90Kernels(self.cp, kernel_source("attention_sm90.cu"), "attention_sm90.cu", names,
                                     OPTIONS + tuple(f"-D{d}" for d in defines),
                                     {f"flash_attention_sm90_d{d}": sm90.smem_bytes(d) for d in SM90_HEAD_DIMS})
        except RuntimeError as e:
            if wanted == "sm90":
                raise
            print(f"prompt attention: {e.args[0].splitlines()[0]}; using the mma.sync kernel", file=sys.stderr)
            return "mma"
        self.sm90_module = built  # kept: its functions live as long as it does
        self.fn |= built.fn
        return "sm90"

    def prepare_functions(self, hopper: bool) -> None:
        """Every kernel loaded so far prepared (and those load_rest adds later, as they come)."""
        self.hopper = hopper
        for name, fn in list(self.fn.items()):
            self.fn[name] = self.prepared(name, fn)

    def prepared(self, name: str, fn):
        """A kernel's cap on dynamic shared memory set; a decode step's kernel (is_dependent) wrapped in
        launch.Kernel: a dependent launch while GpuKernels.dependent is set."""
        if name.startswith("matvec"):
            fn.max_dynamic_shared_size_bytes = MATVEC_STAGE_MAX
        if name.startswith("mmq") and self.hopper:  # a cap: each launch asks for its kind's and tile's share
            fn.max_dynamic_shared_size_bytes = MMQ_SMEM_CAP
        if name in ATTENTION_SMEM:  # over the default 48 KiB of dynamic shared memory
            fn.max_dynamic_shared_size_bytes = ATTENTION_SMEM[name]
        return launch.Kernel(fn, self, fn.kernel.ptr) if is_dependent(name) else fn
