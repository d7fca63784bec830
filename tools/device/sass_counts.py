"""What a kernel's loops execute, read from its machine code on a machine without a GPU: the SASS of a cubin that
`compile_check.py --keep DIR` kept, disassembled by nvdisasm, each loop's body (a backward branch's range, the
innermost first) counted by instruction class. Static counts: a loop's body is what one trip issues, so two forms
of a kernel compare trip for trip before a device call times them (ncu's instruction counts are the measured ones).

    pip download --no-deps nvidia-cuda-nvdisasm   # once: unzip it anywhere, pass its bin/nvdisasm as --nvdisasm
    python tools/device/compile_check.py mmq.cu --kernels mmq_Q4_K --keep /tmp/cubins
    python tools/device/sass_counts.py /tmp/cubins/mmq.cubin --kernels 'mmq_Q4_K_t4$' --nvdisasm PATH
"""
from __future__ import annotations

import argparse
import collections
import re
import subprocess
import sys

# opcode (before the first dot) -> the class it is counted in
CLASSES = {
    "tensor": ("IMMA", "HMMA", "HGMMA", "IGMMA"),
    "int dot": ("IDP", "IDP4A"),
    "float": ("FFMA", "FADD", "FMUL", "FMNMX", "FSETP", "FSEL", "F2F", "I2F", "F2I", "I2FP", "F2IP", "HADD2", "HFMA2",
              "HMUL2"),
    "int": ("IADD3", "IMAD", "LEA", "LOP3", "SHF", "IMNMX", "ISETP", "SEL", "PRMT", "SGXT", "BFE", "BMSK", "POPC",
            "FLO", "IABS", "VIADD", "VIMNMX", "IMUL"),
    "shuffle": ("SHFL",),
    "shared": ("LDS", "STS", "LDSM", "ATOMS"),
    "global": ("LDG", "STG", "LDGSTS", "LDGDEPBAR", "RED", "ATOMG", "LD", "ST"),
    "sync": ("BAR", "DEPBAR", "WARPSYNC", "BSYNC", "BSSY", "MEMBAR"),
    "move": ("MOV", "S2R", "CS2R", "S2UR", "R2UR", "ULDC", "UMOV", "UIADD3", "ULEA", "ULOP3", "USHF", "UISETP", "USEL",
             "UIMAD", "P2R", "R2P", "PLOP3"),
    "branch": ("BRA", "EXIT", "RET", "CALL", "BRX", "JMP"),
}
CLASS_OF = {op: name for name, ops in CLASSES.items() for op in ops}
LINE = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)(\.[\w.]*)?\s*([^;]*);")
FUNC = re.compile(r"^\s*\.text\.(\w+):|Function : (\w+)")


def disassemble(cubin: str, nvdisasm: str) -> dict[str, list[tuple[int, str, str]]]:
    """kernel name -> its instructions as (address, opcode, operands)."""
    out = subprocess.run([nvdisasm, "-c", cubin], capture_output=True, text=True, check=True).stdout
    kernels, labels, current, pending = {}, {}, None, []
    for line in out.splitlines():
        f = FUNC.search(line)
        if f:
            current = f.group(1) or f.group(2)
            kernels[current], labels[current] = [], {}
            continue
        label = re.match(r"^(\.L_x_\d+):", line)
        if label:
            pending.append(label.group(1))  # the address of the instruction that follows
            continue
        m = LINE.search(line)
        if m and current:
            address = int(m.group(1), 16)
            for name in pending:
                labels[current][name] = address
            pending = []
            kernels[current].append((address, m.group(3), m.group(5)))
    return {name: [(at, op, resolve(args, labels[name])) for at, op, args in code] for name, code in kernels.items()}


def resolve(operands: str, labels: dict[str, int]) -> str:
    """A branch's `(.L_x_N) target as its address."""
    return re.sub(r"`\((\.L_x_\d+)\)", lambda m: hex(labels.get(m.group(1), -1)), operands)


def loops(code: list[tuple[int, str, str]]) -> list[tuple[int, int]]:
    """(first, last) addresses of each backward branch's range, innermost (shortest) first."""
    found = []
    for address, op, operands in code:
        target = re.search(r"0x([0-9a-f]+)", operands)
        if op == "BRA" and target and int(target.group(1), 16) <= address:
            found.append((int(target.group(1), 16), address))
    return sorted(set(found), key=lambda r: r[1] - r[0])


def mix(code: list[tuple[int, str, str]], lo: int = 0, hi: int = 1 << 62) -> collections.Counter:
    counts = collections.Counter()
    for address, op, _ in code:
        if lo <= address <= hi:
            counts[CLASS_OF.get(op, "other")] += 1
            counts["all"] += 1
    return counts


def described(counts: collections.Counter) -> str:
    return f"{counts['all']} instructions: " + ", ".join(f"{k} {v}" for k, v in counts.most_common() if k != "all")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("cubin")
    p.add_argument("--kernels", default=".", help="kernels whose name matches (re.search)")
    p.add_argument("--nvdisasm", default="nvdisasm")
    p.add_argument("--loops", type=int, default=3, help="the innermost loops to show a kernel")
    p.add_argument("--tensor-loops", action="store_true", help="only loops that issue tensor-core instructions")
    a = p.parse_args()
    for name, code in disassemble(a.cubin, a.nvdisasm).items():
        if not re.search(a.kernels, name):
            continue
        print(f"{name}: {described(mix(code))}")
        hot = [(lo, hi) for lo, hi in loops(code) if mix(code, lo, hi)["tensor"] or not a.tensor_loops]
        for lo, hi in hot[:a.loops]:
            body = mix(code, lo, hi)
            per = f", {body['all'] / body['tensor']:.0f} a tensor instruction" if body["tensor"] else ""
            print(f"  loop {lo:#06x}-{hi:#06x}, a trip{per}: {described(body)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
