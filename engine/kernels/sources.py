"""The CUDA sources as CuPy compiles them: the files of this folder, each with its local headers pasted
in, and the options every compilation takes."""
from __future__ import annotations

import re
from pathlib import Path

KERNEL_DIR = Path(__file__).resolve().parent
OPTIONS = ("-std=c++17", "--use_fast_math")


def kernel_source(name: str, pasted: set[str] | None = None) -> str:
    """A .cu file of this folder with its local headers (#include "x.cuh") pasted in, each once: the
    code CuPy compiles and caches by, so that a header's change reaches every module that includes it."""
    pasted = set() if pasted is None else pasted
    lines = []
    for line in (KERNEL_DIR / name).read_text().splitlines():
        included = re.fullmatch(r'#include "(\w+\.cuh)"', line.strip())
        if line.strip() == "#pragma once" or (included and included.group(1) in pasted):
            continue
        if included:
            pasted.add(included.group(1))
            lines.append(kernel_source(included.group(1), pasted))
        else:
            lines.append(line)
    return "\n".join(lines) + "\n"
