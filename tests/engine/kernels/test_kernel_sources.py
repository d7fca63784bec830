"""The CUDA sources' contract with their launchers, read from the text (the kernels themselves run on
the device only: tools/device/gpu_kernels_check.py). A decode graph launches every kernel that
engine.kernels.is_dependent names while the kernel before it may still run (engine/kernels/launch.py),
so each of them must call after_producer() before it reads or writes anything or returns: a kernel
that forgot would race its producer, silently and only sometimes."""
import re

import pytest

from engine.kernels import KERNEL_DIR, built_kernels, is_dependent, kernel_source


def braced(source: str, start: int) -> str:
    """The text from the brace at `start` to its match."""
    depth = 0
    for i in range(start, len(source)):
        depth += {"{": 1, "}": -1}.get(source[i], 0)
        if depth == 0:
            return source[start : i + 1]
    raise ValueError("unbalanced braces")


def kernels(source: str) -> dict[str, str]:
    """extern "C" __global__ kernels (macro templates included: names keep their ##) -> body."""
    found = {}
    for m in re.finditer(r'extern "C" __global__', source):
        brace = source.index("{", m.end())
        header = re.sub(r"__launch_bounds__\([^)]*\)", "", source[m.end() : brace])
        name = re.search(r"([\w#]+)\s*\(", header).group(1)
        found[name] = braced(source, brace)
    return found


def device_functions(source: str) -> dict[str, str]:
    return {m.group(1): braced(source, source.index("{", m.end()))
            for m in re.finditer(r"__device__ __forceinline__ [\w:<>, ]+? (\w+)\(", source)}


def waits_first(body: str) -> bool:
    at = body.find("after_producer();")
    early = body.find("return")
    return at >= 0 and (early < 0 or at < early)


def waits(body: str, helpers: dict[str, str], seen: frozenset = frozenset()) -> bool:
    """Whether `body` waits first itself or through the helpers it calls (a kernel's body may be a
    helper that calls the one that waits)."""
    if waits_first(body):
        return True
    callees = set(re.findall(r"\b(\w+)\s*(?:<[^;{}()]*>)?\s*\(", body)) & helpers.keys() - seen
    return any(waits(helpers[c], helpers, seen | callees) for c in callees)


@pytest.mark.parametrize("file", sorted(built_kernels()))
def test_dependent_kernels_wait_for_their_producers(file):
    source = kernel_source(file)
    helpers = device_functions(source)
    checked = 0
    for name, body in kernels(source).items():
        if not is_dependent(name.replace("#", "")):
            continue
        assert waits(body, helpers), f"{file}: kernel {name} launches as a dependent but does not call after_producer() first"
        checked += 1
    assert checked, f"{file} has no dependent kernels"


def test_the_check_follows_helpers_and_can_fail():
    helpers = {"inner": "{ after_producer(); work(); }", "outer": "{ inner(x); }", "lazy": "{ if (x) return; }"}
    assert waits("{ outer(a); }", helpers)
    assert not waits("{ lazy(a); }", helpers)
    assert not waits("{ if (done) return; after_producer(); }", helpers)


def test_every_built_kernel_is_defined():
    defined = set()
    for file in built_kernels():
        defined |= set(kernels(kernel_source(file)))
    # a macro template defines a family (matvec_##T##_n##NB: matvec_Q4_K_n1, ...; NAME: any name)
    patterns = [re.compile("^" + (r"\w+" if n.isupper() else re.sub(r"##\w+?(##|$)", r"\\w+", n)) + "$")
                for n in defined]
    for file, names in built_kernels().items():
        for name in names:
            assert any(p.match(name) for p in patterns), f"{name} ({file}) has no definition"


def test_the_wait_is_hoppers_only():
    text = (KERNEL_DIR / "pdl.cuh").read_text()
    assert text.count("__CUDA_ARCH__ >= 900") == 2  # griddepcontrol and prefetch exist from sm_90 on


def test_mmq_blocks_fit_the_budget_the_kernel_states():
    """mmq.cu sizes its stages from kSmemBudget; the launcher asks for mmq_smem_bytes from MMQ_SMEM:
    the two must be one figure, every kind and tile must keep two slabs in flight within it, and a
    grid never has more blocks than multiprocessors or than tiles."""
    from engine.kernels import MMQ_SMEM, MMQ_TILES, mmq_grid, mmq_smem_bytes, mmq_stages
    from engine.core.quantized import BLOCKS

    budget = re.search(r"constexpr int kSmemBudget = (\d+) \* (\d+);", (KERNEL_DIR / "mmq.cu").read_text())
    assert budget and int(budget.group(1)) * int(budget.group(2)) == MMQ_SMEM
    for kind in BLOCKS:
        for nt in MMQ_TILES:
            stages, stage, sums = mmq_stages(kind, nt)
            assert stages >= 2, f"mmq_{kind}_t{nt}: {stages} slab(s) in flight"
            assert mmq_smem_bytes(kind, nt) == stages * stage + sums <= MMQ_SMEM
    assert mmq_grid(28672, 64, 4, 132) == 132  # 896 x 2 tiles walked by 132 blocks
    assert mmq_grid(4096, 8, 1, 132) == 128  # fewer tiles than multiprocessors: a block each
    assert mmq_grid(1, 1, 1, 132) == 1
