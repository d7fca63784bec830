"""llama.cpp's --n-cpu-moe for a GPU memory cap (issue 46's comparison): the fewest layers whose routed experts stay
in host memory so that what llama-server puts on the GPU (every tensor but those layers' experts, plus an allowance
for its KV cache and compute buffers) fits the cap. llama.cpp has no cap of its own; the step that uses this reads
the GPU's memory once the server is up, so the figure beside Strata's is what each really took.

    python tools/device/ncmoe_for_cap.py FILE CAP_GIB [--allowance-gib 1.5]  -> prints N (0: the file fits)
"""
from __future__ import annotations

import argparse
import re

from gguf import GGUFReader

EXPERTS = re.compile(r"blk\.(\d+)\.ffn_(gate|up|down)_exps\.")


def layer_expert_bytes(path: str) -> tuple[int, dict[int, int]]:
    """The file's tensor bytes in all, and each layer's routed experts' bytes."""
    total, per_layer = 0, {}
    for t in GGUFReader(path).tensors:
        total += int(t.n_bytes)
        if (hit := EXPERTS.match(t.name)):
            layer = int(hit.group(1))
            per_layer[layer] = per_layer.get(layer, 0) + int(t.n_bytes)
    return total, per_layer


def n_cpu_moe(total: int, per_layer: dict[int, int], cap: int) -> int:
    """The least N such that the tensors less the first N layers' experts fit `cap` bytes (ValueError: none does)."""
    on_gpu = total
    for n, layer in enumerate([None] + sorted(per_layer)):
        if layer is not None:
            on_gpu -= per_layer[layer]
        if on_gpu <= cap:
            return n
    raise ValueError(f"even every expert on the host leaves {on_gpu / 2**30:.2f} GiB, over the cap")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("file")
    p.add_argument("cap_gib", type=float)
    p.add_argument("--allowance-gib", type=float, default=1.5, help="KV cache and compute buffers beside the weights")
    a = p.parse_args()
    total, per_layer = layer_expert_bytes(a.file)
    print(n_cpu_moe(total, per_layer, round((a.cap_gib - a.allowance_gib) * 2**30)))


if __name__ == "__main__":
    main()
