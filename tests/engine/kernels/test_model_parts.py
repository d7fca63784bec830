"""model_parts.py's layout against the CUDA sources: every kernel a model's steps ask for lies in the parts
a first start builds for it. Each part is preprocessed as NVRTC sees it (-DPARTS, -DPART) by the C
preprocessor, and its extern "C" kernels read from the result; the loader then takes the model's parts,
and a kernel outside them is built and loaded when first asked for."""
from __future__ import annotations

import functools
import re
from dataclasses import replace
from types import SimpleNamespace

import pytest

from engine.core.quantized import BLOCKS
from engine.kernels import build, built_kernels, sm90
from engine.kernels.loader import KernelLoader
from engine.kernels.model_parts import ModelKernels
from engine.modelfile.gguf_file import GGUFFile
from engine.modelfile.model_config import read_config
from engine.startup import model_kernels
from tests.engine.kernels.host_cuda import kernels_in

KIND = "|".join(sorted([*BLOCKS, "F16"], key=len, reverse=True))  # a kernel name's weight type (longest first)
MODELS = {  # name -> what decides its kernels
    "llama3-8b Q4_K_M": ModelKernels(frozenset({"Q4_K", "Q6_K"}), 128, 4),
    "llama3-8b Q4_K_M, $STRATA_SBQ=1": ModelKernels(frozenset({"Q4_K", "Q6_K"}), 128, 4, sbq=True),
    "qwen2.5-0.5b Q8_0": ModelKernels(frozenset({"Q8_0"}), 64, 7),
    "qwen3-30b-a3b Q4_K_M": ModelKernels(frozenset({"Q4_K", "Q6_K"}), 128, 8, moe=True),
    "qwen3-next-80b-a3b IQ3_S": ModelKernels(frozenset({"IQ3_S", "Q6_K", "F32"}), 256, 8, moe=True, hybrid=True),
    "smollm2 F16": ModelKernels(frozenset({"F16"}), 64, 3),
    "a BF16 file": ModelKernels(frozenset({"BF16"}), 128, 1),
    "every kind": ModelKernels(frozenset({*BLOCKS, "F16", "BF16"}), 64, 8),
}


def first_built(model: ModelKernels) -> list[build.Unit]:
    return [unit for unit in build.units(built_kernels()) if model.wants(unit)]


@functools.cache
def defined(unit: build.Unit) -> frozenset[str]:
    """The kernels one compilation holds: its source preprocessed with its -D options."""
    return kernels_in(unit.source, tuple(o[2:] for o in unit.options(()) if o.startswith("-D")))


def asked_for(model: ModelKernels) -> set[str]:
    """The kernels a model's steps launch, by their names (the launchers' naming, read independently)."""
    kinds = model.kinds
    names = set()
    for source, kernels in built_kernels().items():
        for name in kernels:
            if source == "moe.cu":
                ok = model.moe
            elif source == "linear_attention.cu":
                ok = model.hybrid
            elif source == "sbq.cu":  # $STRATA_SBQ's kernels, for its kinds
                m = re.fullmatch(r"sbq_(Q4_K|Q6_K)_\w+", name)
                ok = model.sbq and (m is None and bool(kinds & {"Q4_K", "Q6_K"}) or m is not None and m[1] in kinds)
            elif m := re.fullmatch(r"flash_decode(?:_q8)?_d(\d+)_g(\d+)", name):  # an even group over 4 runs as
                # two blocks of half of it, a 256-wide head's in blocks of at most 2 (the launcher's rule, restated)
                heads = model.group // 2 if model.group > 4 and model.group % 2 == 0 else model.group
                if model.head_dim > 128:
                    heads = max(h for h in (1, 2) if model.group % h == 0)
                ok = (int(m[1]), int(m[2])) == (model.head_dim, heads)
            elif m := re.fullmatch(r"flash_attention_d(\d+)", name):
                ok = int(m[1]) == model.head_dim
            elif m := re.fullmatch(r"matvec2_(\w+)_(Q6_K)", name):
                ok = {m[1], m[2]} <= kinds
            elif m := re.fullmatch(rf"(?:matvec|mmq|dequant|embed|matvec_act|matvec_norm)_({KIND})(?:_[nt]\d+)?(?:_f32)?",
                                   name):
                ok = m[1] in kinds
            else:  # quantize_q8, dequant_BF16, widen_q8_0_blocks, norm/rope, argmax, the fp16 mmv: every model's
                ok = True
            if ok:
                names.add(name)
    return names


def test_the_kernel_names_are_read_for_every_kind():
    every = asked_for(MODELS["every kind"])
    assert {"matvec_Q4_K_n16_f32", "mmq_Q5_1_t4", "dequant_F16", "embed_Q6_K", "matvec2_Q4_K_Q6_K", "matvec_act_IQ3_S",
            "flash_decode_q8_d64_g4", "flash_attention_d64"} <= every
    assert not {"flash_decode_d64_g8", "flash_decode_d128_g4", "router_route"} & every
    assert "flash_decode_d64_g7" in asked_for(MODELS["qwen2.5-0.5b Q8_0"])


@pytest.mark.parametrize("name", sorted(MODELS))
def test_a_models_parts_hold_every_kernel_it_asks_for(name):
    model = MODELS[name]
    held = set().union(*(defined(unit) for unit in first_built(model)))
    missing = asked_for(model) - held
    assert not missing, f"{name}: {sorted(missing)[:10]} in none of {[u.describe() for u in first_built(model)]}"


def test_every_part_of_every_file_holds_what_built_kernels_lists():
    """The layout's other half: together the parts hold every kernel (none lost between parts)."""
    every = set().union(*(defined(unit) for unit in build.units(built_kernels())))
    listed = {name for names in built_kernels().values() for name in names}
    assert listed <= every, sorted(listed - every)[:10]


def test_a_first_start_builds_a_sixth_of_the_parts_for_the_8b_shape():
    units = first_built(MODELS["llama3-8b Q4_K_M"])
    assert [u.describe() for u in units] == [
        "quant.cu part 11/30", "quant.cu part 12/30", "quant.cu part 15/30", "quant.cu part 16/30",
        "attention.cu part 10/21", "attention.cu part 14/21", "mmq.cu part 6/15", "mmq.cu part 8/15",
        "norm_rope.cu", "argmax.cu", "mmv.cu"]
    assert len(build.units(built_kernels())) == 72


def test_a_draft_models_parts_are_built_at_start_beside_the_targets(model_path):
    """--draft: the draft's kernels (its kinds, head size, grouping) are among the first start's, so that its first
    draft asks for none outside them (load_rest's compiler processes, once the KV pool holds the card, found no
    memory for their CUDA contexts: the 135M shape drafting for the 8B shape on a fresh H100)."""
    target, draft = MODELS["llama3-8b Q4_K_M"], MODELS["smollm2 F16"]
    both = replace(target, beside=(draft,))
    assert set(first_built(both)) == set(first_built(target)) | set(first_built(draft))
    held = set().union(*(defined(unit) for unit in first_built(both)))
    assert not (asked_for(draft) | asked_for(target)) - held
    reader = GGUFFile(model_path, "r")
    assert model_kernels(reader, None) == ModelKernels.of(read_config(reader), reader)
    assert model_kernels(reader, GGUFFile(model_path, "r")).beside == (ModelKernels.of(read_config(reader), reader),)


def test_the_default_models_file_gives_its_kinds_head_size_and_group(model_path):
    reader = GGUFFile(model_path, "r")
    model = ModelKernels.of(read_config(reader), reader)
    assert model == ModelKernels(frozenset({"Q4_1", "Q8_0"}), 64, 3, moe=False)


class PreprocessedModule:
    """CuPy's RawModule as far as the loader uses it, the kernels it holds read by the preprocessor."""

    def __init__(self, unit: build.Unit):
        self.kernels = defined(unit)

    def get_function(self, name: str):
        if name not in self.kernels:
            raise LookupError(name)
        return SimpleNamespace(name=name, kernel=SimpleNamespace(ptr=0))


def test_a_kernel_outside_the_models_parts_is_loaded_at_its_first_use(monkeypatch):
    built, workers = [], []

    def prebuild(cp, todo, defines, processes=None):
        built.append(list(todo))
        workers.append(processes)

    monkeypatch.setattr(build, "prebuild", prebuild)
    monkeypatch.setattr(build, "module", lambda cp, unit, defines: PreprocessedModule(unit))
    loader = KernelLoader()
    free = [80 << 30]  # the device's free bytes (a running engine's KV pool leaves little)
    loader.cp = SimpleNamespace(cuda=SimpleNamespace(Device=lambda: SimpleNamespace(compute_capability="80"),
                                                     runtime=SimpleNamespace(memGetInfo=lambda: (free[0], 80 << 30))))
    monkeypatch.setattr(sm90, "supported", lambda cp: False)
    model = MODELS["llama3-8b Q4_K_M"]
    loader.load_modules((), model, "mma")  # the build starts in a thread; ready() waits for it
    loader.ready()
    assert built == [first_built(model)] and loader.prompt_attention == "mma"
    listed = {name for names in built_kernels().values() for name in names}
    assert asked_for(model) <= set(loader.fn) == set().union(*map(defined, first_built(model))) & listed
    assert loader.fn["flash_decode_d128_g4"].name == "flash_decode_d128_g4"  # a decode kernel, wrapped
    assert "matvec_Q8_0_n1" not in loader.fn
    assert loader.fn["matvec_Q8_0_n1"].name == "matvec_Q8_0_n1"  # built with the rest of its file, then found
    quant = {unit for unit in build.units(built_kernels()) if unit.source == "quant.cu"}
    assert len(built) == 2 and set(built[1]) == quant - set(first_built(model)) and workers[1] >= 1
    free[0] = 600 << 20  # the pool holds the card: no room for a compiler process's context
    assert loader.fn["flash_decode_d64_g7"].name == "flash_decode_d64_g7"
    attention = {unit for unit in build.units(built_kernels()) if unit.source == "attention.cu"}
    assert set(built[2]) == attention - set(first_built(model)) and workers[2] == 0  # in the engine's process
    with pytest.raises(KeyError, match="no kernel 'matvec_Q9_9_n1'"):
        loader.fn["matvec_Q9_9_n1"]


def test_a_build_with_no_room_for_compiler_processes_runs_in_the_engines_own(monkeypatch, tmp_path):
    """prebuild(workers=0): each part compiled in this process, one after another, and stamped as the workers'
    are (a later start finds them in the cache); parts stamped already are not compiled again."""
    compiled = []
    monkeypatch.setattr(build, "stamp_path", lambda cp, unit, defines: tmp_path / f"{unit.source}.{unit.part}")
    monkeypatch.setattr(build, "compile_unit", lambda unit, defines: compiled.append(unit) or 0.5)
    monkeypatch.setattr(build, "ProcessPoolExecutor", None)  # (no process is started)
    units = [unit for unit in build.units(built_kernels()) if unit.source == "attention.cu"][:3]
    (tmp_path / "attention.cu.1").write_text("compiled before\n")
    build.prebuild(None, units, (), 0)
    assert compiled == [units[0], units[2]] and all((tmp_path / f"attention.cu.{u.part}").exists() for u in units)
    build.prebuild(None, units, (), 0)
    assert len(compiled) == 2
