"""Files quantized by llama.cpp itself to the IQ types (issue 45): each IQ tensor's rows as the engine
loads them equal gguf-py's dequantization of the same bytes, and the model's logits stay near the F16
file's it was made from (a quantization's error, not a layout's).

The IQ files are made with llama.cpp's own quantizer through llama-cpp-python (`pip install
llama-cpp-python`, a CPU build), from an F16 file such as tools/fixtures/make_synthetic_gguf.py writes
(rows of 256 or more: the IQ types' super-blocks):

    python tools/fixtures/make_synthetic_gguf.py F16.gguf --arch llama --layers 2 --dim 256 --ffn 512 \\
        --heads 4 --kv-heads 2 --head-dim 64 --ctx 512 --type F16 --seed 3
    python tools/checks/iq_files_check.py F16.gguf --quantize IQ4_XS IQ3_S IQ4_NL   # with llama-cpp-python
    python tools/checks/iq_files_check.py F16.gguf --check IQ4_XS IQ3_S IQ4_NL      # with the project's env

(IQ3_XXS, IQ2_* and IQ1_* need an importance matrix, which the binding cannot pass.)
"""
from __future__ import annotations

import argparse
import ctypes
import sys
from pathlib import Path

import numpy as np


def quantized_path(f16: Path, kind: str) -> Path:
    return f16.with_name(f"{f16.stem}-{kind}.gguf")


def quantize(f16: Path, kinds: list[str]) -> None:
    import llama_cpp

    for kind in kinds:
        params = llama_cpp.llama_model_quantize_default_params()
        params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{kind}")
        rc = llama_cpp.llama_model_quantize(str(f16).encode(), str(quantized_path(f16, kind)).encode(),
                                            ctypes.byref(params))
        print(f"{kind}: {'written' if rc == 0 else f'refused (rc {rc})'}")


def check(f16: Path, kinds: list[str]) -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from gguf import GGUFReader
    from gguf.quants import dequantize

    from engine.kvcache.kv import KVCache
    from engine.model.forward import LlamaModel
    from engine.model.weights import TensorRows, load_model
    from engine.ops.backend import cpu_backend

    ids = np.random.default_rng(0).integers(0, 2000, 40)

    def logits(path: Path) -> np.ndarray:
        backend = cpu_backend()
        cfg, weights, _ = load_model(str(path), backend)
        return LlamaModel(cfg, weights, backend).prefill(ids, KVCache(cfg, 256, backend), 64)  # (vocab,)

    reference, failed = logits(f16), 0
    for kind in kinds:
        path = quantized_path(f16, kind)
        types, worst = {}, 0.0
        for tensor in GGUFReader(str(path)).tensors:
            types[tensor.tensor_type.name] = types.get(tensor.tensor_type.name, 0) + 1
            if tensor.tensor_type.name.startswith("IQ"):
                rows = TensorRows(tensor).values()
                worst = max(worst, float(np.abs(rows - dequantize(tensor.data, tensor.tensor_type).reshape(rows.shape)).max()))
        got = logits(path)
        rel = float(np.abs(got - reference).max() / np.abs(reference).max())
        ok = worst == 0.0 and np.argmax(got) == np.argmax(reference)
        failed += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {kind}: tensors {types}; rows vs gguf-py max |d| {worst}; logits vs F16 "
              f"max relative {rel:.3f}, the same top token: {np.argmax(got) == np.argmax(reference)}")
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("f16", type=Path)
    p.add_argument("--quantize", nargs="+", metavar="TYPE", help="write F16-TYPE.gguf with llama.cpp's quantizer")
    p.add_argument("--check", nargs="+", metavar="TYPE", help="check F16-TYPE.gguf against gguf-py and the F16 file")
    a = p.parse_args(argv)
    if a.quantize:
        quantize(a.f16, a.quantize)
    return check(a.f16, a.check) if a.check else 0


if __name__ == "__main__":
    sys.exit(main())
