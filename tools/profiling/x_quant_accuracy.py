"""How much a decode row's activations lose in 8 bits, by the form of their scales (issue 48's question: which x
format an integer-order kernel may take). On the CPU, a real model's decode steps teacher-forced over a real text,
every matrix product's x first quantized and dequantized as each form would carry it:
  q8_32   a float scale per 32 values (today's GPU decode rows: q8.cuh, the matvec and mmq kernels)
  q8_256  a float scale per 256 (llama.cpp's Q8_K: one scale a K-quant super-block, integer sums across it)
  mx_32   a power-of-two scale per 32 (OCP's MXINT8: per-32 resolution, and integer sums across a super-block
          by shifts, the scales' exponents being integers)
  q8_256x32  a float scale per 256 times an 8-bit integer per 32 (as the K-quants scale their sub-blocks): per-32
          resolution, and integer sums across a super-block (each unit's sum times its integer)
against the unquantized rows: the logits' KL divergence from them, the greedy token's agreement, the largest logit
difference.

    python tools/profiling/x_quant_accuracy.py [MODEL.gguf] [--tokens 160] [--json FILE]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from kv_type_bench import log_softmax  # noqa: E402
from tools.fixtures.fetch_fixture import fixture_path  # noqa: E402


def quantized(x: np.ndarray, group: int, scale: str) -> np.ndarray:
    """x (n, k) float32 as int8 quants by groups of `group` values times their scale (round to nearest): a float
    (`float`), a power of two at least the float (`pow2`), or a float per 256 times an integer 1..255 per group
    (`sub8`: the least multiple of the 256's step at least the group's float)."""
    n, k = x.shape
    span = 256 if scale == "sub8" else group
    pad = -k % span  # a last group short of `group` values (zeros change no scale)
    g = np.pad(x, ((0, 0), (0, pad))).reshape(n, -1, group).astype(np.float64)
    amax = np.abs(g).max(axis=2, keepdims=True)
    d = amax / 127.0
    if scale == "pow2":
        d = np.where(amax > 0, np.exp2(np.ceil(np.log2(np.maximum(d, 1e-38)))), 0.0)
    elif scale == "sub8":
        per = span // group
        top = d.reshape(n, -1, per).max(axis=2, keepdims=True)  # (n, supers, 1): the 256's largest float
        step = np.repeat(top / 255.0, per, axis=1)  # the 256's step, one a group
        d = np.where(step > 0, np.ceil(d / np.where(step > 0, step, 1)) * step, 0.0)
    q = np.where(d > 0, np.clip(np.rint(g / np.where(d > 0, d, 1)), -127, 127), 0)
    return (q * d).reshape(n, k + pad)[:, :k].astype(np.float32)


FORMS = {"q8_32": (32, "float"), "q8_256": (256, "float"), "mx_32": (32, "pow2"), "q8_256x32": (32, "sub8")}


class TeacherForced:
    """The model loaded once on the CPU and the text's tokens; logits(form) runs the decode steps over them, every
    decode row's matrix products taking x in `form` (None: as it comes)."""

    def __init__(self, path: str, tokens: int):
        from engine.model.weights import load_model
        from engine.modelfile.gguf_file import GGUFFile
        from engine.modelfile.tokenizer import GGUFTokenizer
        from engine.ops import backend as be
        from engine.runner.runner import ModelRunner

        backend = be.cpu_backend()
        plain, teacher = type(backend.ops).matmul, self
        self.form: str | None = None

        def matmul(ops, x, w):
            if ops.decoding and teacher.form is not None:
                x = quantized(np.asarray(x, np.float32), *FORMS[teacher.form])
            return plain(ops, x, w)
        backend.ops.matmul = matmul.__get__(backend.ops)
        cfg, weights, _ = load_model(path, backend, keep_blocks=False)
        self.runner = ModelRunner(cfg, weights, backend, 1024, 256, frozenset(), max_running=1)
        text = (ROOT / "engine/loop/rounds.py").read_text()[:6000]
        self.ids = GGUFTokenizer(GGUFFile(path)).encode(text)[: 64 + tokens]

    def logits(self, form: str | None) -> np.ndarray:
        """(positions, vocab) float64: after the first 64 tokens (read unquantized), each next one's decode step."""
        self.form, runner, ids = form, self.runner, self.ids
        table = runner.pool.allocate(runner.pool.blocks_for(len(ids) + 1))
        runner.model.forward_reads([(np.asarray(ids[:64]), 0, table, False)], runner.kv)
        out = [np.asarray(runner.decode_logits([ids[pos]], [table], [pos]))[0].astype(np.float64)
               for pos in range(64, len(ids))]
        runner.pool.release(table)
        return np.stack(out)


def compare(ref: np.ndarray, got: np.ndarray) -> dict:
    lp, lq = log_softmax(ref), log_softmax(got)
    kl = (np.exp(lp) * (lp - lq)).sum(axis=1)
    return {"kl_mean": float(kl.mean()), "kl_max": float(kl.max()),
            "greedy_agree": float((ref.argmax(1) == got.argmax(1)).mean()),
            "logit_diff_max": float(np.abs(ref - got).max()), "positions": int(len(ref))}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", nargs="?", default=str(fixture_path()), help="default: the Qwen2.5-Coder-0.5B fixture")
    p.add_argument("--tokens", type=int, default=160)
    p.add_argument("--forms", default=",".join(FORMS), help=f"a comma list of {', '.join(FORMS)}")
    p.add_argument("--json")
    a = p.parse_args()
    teacher = TeacherForced(a.model, a.tokens)
    ref = teacher.logits(None)
    report = {"model": Path(a.model).name, "forms": {}}
    for form in a.forms.split(","):
        report["forms"][form] = compare(ref, teacher.logits(form))
        print(form, json.dumps(report["forms"][form]), flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
