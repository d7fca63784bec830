"""A GGUF of any supported architecture (llama, qwen2, qwen3, qwen3moe), shape and weight type, with
random weights of sane magnitude and the default model's tokenizer and chat template: any model
size can be measured where no large model can be downloaded, and each family's forward pass
checked against a reference on a tiny one. Quantized tensors are written as blocks directly (random quants with
valid scales), so no float32 copy of the model is ever made and K-quants need no quantizer.

    python tools/make_synthetic_gguf.py OUT.gguf --preset llama3-8b --type F16
    python tools/make_synthetic_gguf.py OUT.gguf --layers 4 --dim 512 --ffn 1536 --heads 8 --kv-heads 2 --type Q4_K
    python tools/make_synthetic_gguf.py OUT.gguf --preset qwen3-30b-a3b --type Q4_K_M
    python tools/make_synthetic_gguf.py OUT.gguf --arch qwen3moe --layers 2 --dim 64 --heads 4 --kv-heads 2 \
        --head-dim 32 --experts 8 --experts-used 2 --expert-ffn 48 --type F32

Types: F16 BF16 F32 Q8_0 Q4_0 Q4_1 Q5_0 Q5_1 Q4_K Q5_K Q6_K, and Q4_K_M (Q4_K, with Q6_K for
attn_v, ffn_down and the output head, as llama.cpp's Q4_K_M mix). A tensor whose rows do not
divide into the type's blocks falls back to Q8_0 (or F16), as llama.cpp's quantizer does.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as Q, GGUFReader, GGUFWriter, RopeScalingType

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from engine.modelfile.model_path import default_model_path  # noqa: E402

PRESETS = {  # layers, dim, ffn, heads, kv_heads, context, rope base, vocab (None = the tokenizer's)
    "llama3-8b": dict(layers=32, dim=4096, ffn=14336, heads=32, kv_heads=8, ctx=131072, rope_base=500000.0,
                      vocab=128256),
    "llama3-70b": dict(layers=80, dim=8192, ffn=28672, heads=64, kv_heads=8, ctx=131072, rope_base=500000.0,
                       vocab=128256),
    "smollm2-135m": dict(layers=30, dim=576, ffn=1536, heads=9, kv_heads=3, ctx=8192, rope_base=100000.0,
                         vocab=None),
    "tiny": dict(layers=2, dim=256, ffn=512, heads=4, kv_heads=2, ctx=4096, rope_base=10000.0, vocab=None),
    "qwen3-8b": dict(arch="qwen3", layers=36, dim=4096, ffn=12288, heads=32, kv_heads=8, head_dim=128, ctx=40960,
                     rope_base=1000000.0, vocab=151936),
    "qwen3-30b-a3b": dict(arch="qwen3moe", layers=48, dim=2048, ffn=6144, heads=32, kv_heads=4, head_dim=128,
                          experts=128, experts_used=8, expert_ffn=768, ctx=40960, rope_base=1000000.0, vocab=151936),
}
ARCHES = ("llama", "qwen2", "qwen3", "qwen3moe")
WEIGHT_STD = 0.02  # the spread of a trained 8B model's weights, roughly
BLOCK = {Q.Q8_0: (32, 34), Q.Q4_0: (32, 18), Q.Q4_1: (32, 20), Q.Q5_0: (32, 22), Q.Q5_1: (32, 24),
         Q.Q4_K: (256, 144), Q.Q5_K: (256, 176), Q.Q6_K: (256, 210)}


# ---------------------------------------------------------------- random tensors

def half_bytes(rng, n: int, value: float) -> np.ndarray:
    """n fp16 scale fields near `value` (within +-25%), as (n, 2) bytes."""
    return (value * rng.uniform(0.75, 1.25, n)).astype(np.float16).view(np.uint8).reshape(n, 2)


def random_blocks(rng, qtype: Q, rows: int, cols: int, std: float) -> np.ndarray:
    """(rows, cols // block * block_bytes) uint8: random quants, scales chosen so the dequantized
    values spread about `std`."""
    size, nbytes = BLOCK[qtype]
    n = rows * cols // size
    raw = rng.integers(0, 256, (n, nbytes), dtype=np.uint8)
    if qtype == Q.Q8_0:  # d, qs[32] int8 in [-127, 127] (std ~73)
        raw[:, :2] = half_bytes(rng, n, std / 73)
        raw[:, 2:][raw[:, 2:] == 0x80] = 0x81
    elif qtype in (Q.Q4_0, Q.Q5_0):  # d, [qh], qs: q - 8 (or - 16) uniform
        raw[:, :2] = half_bytes(rng, n, std / (4.6 if qtype == Q.Q4_0 else 9.2))
    elif qtype in (Q.Q4_1, Q.Q5_1):  # d, m, [qh], qs: d*q + m, centred by m
        spread = 4.6 if qtype == Q.Q4_1 else 9.2
        d = std / spread
        raw[:, :2] = half_bytes(rng, n, d)
        raw[:, 2:4] = np.full(n, -d * (7.5 if qtype == Q.Q4_1 else 15.5), np.float16).view(np.uint8).reshape(n, 2)
    elif qtype in (Q.Q4_K, Q.Q5_K):  # d, dmin, 12 bytes of 6-bit scale/min pairs (any bytes are valid)
        sc_mean, q_mid = 31.5, (7.5 if qtype == Q.Q4_K else 15.5)
        d = std / (sc_mean * (4.6 if qtype == Q.Q4_K else 9.2))
        raw[:, :2] = half_bytes(rng, n, d)
        raw[:, 2:4] = half_bytes(rng, n, d * q_mid)  # dmin * m ~ d * sc * q_mid: centred on average
    elif qtype == Q.Q6_K:  # ql[128], qh[64], scales[16] int8, d: d * sc * (q - 32)
        raw[:, 192:208] = rng.integers(16, 64, (n, 16), dtype=np.uint8)  # positive int8 scales
        raw[:, 208:210] = half_bytes(rng, n, std / (40 * 18.5))
    return raw.reshape(rows, cols // size * nbytes)


def random_half(rng, rows: int, cols: int, bf16: bool) -> np.ndarray:
    """Random fp16 / bf16 bit patterns of magnitude ~[std/4, 2*std), random sign, built from
    integers (a float32 intermediate of an 8B model would take minutes and 32 GB)."""
    bits = rng.integers(0, 1 << 16, (rows, cols), dtype=np.uint16)
    if bf16:  # sign | exponent 8 bits | mantissa 7 bits
        e0 = int(np.floor(np.log2(WEIGHT_STD / 4))) + 127
        return (bits & 0x807F) | ((e0 + (bits >> 7) % 3).astype(np.uint16) << 7)
    e0 = int(np.floor(np.log2(WEIGHT_STD / 4))) + 15
    return ((bits & 0x83FF) | ((e0 + (bits >> 10) % 3).astype(np.uint16) << 10)).view(np.float16)


class RandomPool:
    """Tensors cut at random offsets from one random buffer per type: an 8B model's 15 GB then
    costs copies, not 8e9 random draws (weights for measuring speed need only look random)."""

    VALUES = 1 << 27  # per buffer: 128 Mi values (256 MiB of fp16)

    def __init__(self, rng):
        self.rng, self.buffers = rng, {}

    def take(self, qtype: Q, rows: int, cols: int) -> np.ndarray:
        if qtype not in self.buffers:
            self.buffers[qtype] = (random_blocks(self.rng, qtype, self.VALUES // BLOCK[qtype][0], BLOCK[qtype][0],
                                                 WEIGHT_STD) if qtype in BLOCK else
                                   random_half(self.rng, 1, self.VALUES, qtype == Q.BF16)[0])
        buf = self.buffers[qtype]  # (units, ...): blocks of the type, or single values
        n = rows * cols // (BLOCK[qtype][0] if qtype in BLOCK else 1)
        out, pos, off = np.empty((n,) + buf.shape[1:], buf.dtype), 0, int(self.rng.integers(len(buf)))
        while pos < n:
            k = min(n - pos, len(buf) - off)
            out[pos : pos + k] = buf[off : off + k]
            pos, off = pos + k, 0
        return out.reshape(rows, -1)


def fits(qtype: Q, cols: int) -> bool:
    return qtype not in BLOCK or cols % BLOCK[qtype][0] == 0


def tensor_type(kind: str, file_type: str) -> Q:
    """The type of one tensor: `kind` is the tensor's role (attn_v, ffn_down, output, ...)."""
    if file_type == "Q4_K_M":
        return Q.Q6_K if kind in ("attn_v", "ffn_down", "output") else Q.Q4_K
    return Q[file_type]


# ---------------------------------------------------------------- the model

def tensor_plan(a) -> list[tuple[str, str, tuple[int, ...]]]:
    """(name, role, numpy shape (out, in), or (experts, out, in)) of every tensor, in file order."""
    q, kv = a.heads * a.head_dim, a.kv_heads * a.head_dim
    plan = [("token_embd.weight", "token_embd", (a.vocab, a.dim))]
    for i in range(a.layers):
        p = f"blk.{i}."
        plan += [(p + "attn_norm.weight", "norm", (a.dim,)), (p + "attn_q.weight", "attn_q", (q, a.dim)),
                 (p + "attn_k.weight", "attn_k", (kv, a.dim)), (p + "attn_v.weight", "attn_v", (kv, a.dim))]
        if a.arch == "qwen2":
            plan += [(p + "attn_q.bias", "bias", (q,)), (p + "attn_k.bias", "bias", (kv,)), (p + "attn_v.bias", "bias", (kv,))]
        if a.arch in ("qwen3", "qwen3moe"):
            plan += [(p + "attn_q_norm.weight", "norm", (a.head_dim,)), (p + "attn_k_norm.weight", "norm", (a.head_dim,))]
        plan += [(p + "attn_output.weight", "attn_output", (a.dim, q)), (p + "ffn_norm.weight", "norm", (a.dim,))]
        if a.arch == "qwen3moe":
            e, f = a.experts, a.expert_ffn
            plan += [(p + "ffn_gate_inp.weight", "router", (e, a.dim)),
                     (p + "ffn_gate_exps.weight", "ffn_gate", (e, f, a.dim)),
                     (p + "ffn_up_exps.weight", "ffn_up", (e, f, a.dim)),
                     (p + "ffn_down_exps.weight", "ffn_down", (e, a.dim, f))]
        else:
            plan += [(p + "ffn_gate.weight", "ffn_gate", (a.ffn, a.dim)), (p + "ffn_up.weight", "ffn_up", (a.ffn, a.dim)),
                     (p + "ffn_down.weight", "ffn_down", (a.dim, a.ffn))]
    plan.append(("output_norm.weight", "norm", (a.dim,)))
    if not a.tied:
        plan.append(("output.weight", "output", (a.vocab, a.dim)))
    return plan


def make_tensor(pool: RandomPool, role: str, shape, file_type: str) -> tuple[np.ndarray, Q]:
    if len(shape) == 1:  # norm weights around 1, biases around 0
        base = 0.0 if role == "bias" else 1.0
        return (base + 0.05 * pool.rng.standard_normal(shape)).astype(np.float32), Q.F32
    qtype = planned_type(role, shape, file_type)
    if qtype == Q.F32:
        return (WEIGHT_STD * (5.0 if role == "router" else 1.0) * pool.rng.standard_normal(shape)).astype(np.float32), Q.F32
    rows, cols = int(np.prod(shape[:-1])), shape[-1]
    data = pool.take(qtype, rows, cols)
    data = data.view(np.uint8) if qtype == Q.BF16 else data
    return data.reshape(*shape[:-1], data.shape[-1]), qtype


def copy_tokenizer(w: GGUFWriter, src: GGUFReader, vocab: int | None, template: str | None = None) -> int:
    """The default model's tokenizer and template (or `template`, or none where the source has none);
    `vocab` pads the token list with unused tokens."""
    f = lambda k: src.fields[k].contents()  # noqa: E731
    tokens, types = list(f("tokenizer.ggml.tokens")), list(f("tokenizer.ggml.token_type"))
    if vocab is not None and vocab > len(tokens):
        tokens += [f"<|unused_{i}|>" for i in range(vocab - len(tokens))]
        types += [5] * (vocab - len(types))  # UNUSED
    w.add_tokenizer_model(f("tokenizer.ggml.model"))
    w.add_tokenizer_pre(f("tokenizer.ggml.pre"))
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(list(f("tokenizer.ggml.merges")))
    for key in ("bos_token_id", "eos_token_id", "unknown_token_id", "padding_token_id"):
        if f"tokenizer.ggml.{key}" in src.fields:
            w.add_uint32(f"tokenizer.ggml.{key}", int(f(f"tokenizer.ggml.{key}")))
    if template is None and "tokenizer.chat_template" in src.fields:
        template = f("tokenizer.chat_template")
    if template is not None:  # a bare vocabulary (tests/fixtures/vocab/) has none: the server then says so on /chat
        w.add_chat_template(template)
    return len(tokens)


def write_model(a) -> None:
    src = GGUFReader(a.tokenizer or str(default_model_path()))
    w = GGUFWriter(a.out, a.arch)
    w.add_name(f"synthetic {a.preset or a.arch} {a.type}")
    a.vocab = copy_tokenizer(w, src, a.vocab, Path(a.chat_template).read_text() if a.chat_template else None)
    w.add_block_count(a.layers)
    w.add_context_length(a.ctx)
    w.add_embedding_length(a.dim)
    w.add_feed_forward_length(a.ffn)
    w.add_head_count(a.heads)
    w.add_head_count_kv(a.kv_heads)
    if a.arch != "llama" or a.head_dim != a.dim // a.heads:
        w.add_key_length(a.head_dim)
        w.add_value_length(a.head_dim)
    if a.arch == "qwen3moe":
        w.add_expert_count(a.experts)
        w.add_expert_used_count(a.experts_used)
        w.add_expert_feed_forward_length(a.expert_ffn)
    w.add_rope_freq_base(a.rope_base)
    if a.yarn:  # FACTOR,ORIGINAL_CTX: the keys convert_hf_to_gguf writes for a YaRN rope_scaling
        factor, original = a.yarn.split(",")
        w.add_rope_scaling_type(RopeScalingType.YARN)
        w.add_rope_scaling_factor(float(factor))
        w.add_rope_scaling_orig_ctx_len(int(original))
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(a.vocab)
    pool = RandomPool(np.random.default_rng(a.seed))
    plan = tensor_plan(a)
    extra = {"rope_freqs.weight": llama3_rope_factors(a)} if a.llama3_rope else {}
    for name, role, shape in plan:  # tensor infos first, then each tensor's data made and written in turn
        qtype = planned_type(role, shape, a.type)
        nbytes = planned_nbytes(qtype, shape)
        if qtype in (Q.F32, Q.F16):
            w.add_tensor_info(name, shape, np.dtype(np.float32 if qtype == Q.F32 else np.float16), nbytes)
        else:  # block types (and BF16) are described by their byte shape
            rows = int(np.prod(shape[:-1]))
            w.add_tensor_info(name, (*shape[:-1], nbytes // rows), np.dtype(np.uint8), nbytes, raw_dtype=qtype)
    for name, values in extra.items():
        w.add_tensor_info(name, values.shape, values.dtype, values.nbytes)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    started, total = time.monotonic(), 0
    for i, (name, role, shape) in enumerate(plan):
        data, _ = make_tensor(pool, role, shape, a.type)
        w.write_tensor_data(data)
        total += data.nbytes
        if i % 50 == 0 or i == len(plan) - 1:
            print(f"{i + 1}/{len(plan)} tensors, {total / 2**30:.2f} GiB, {time.monotonic() - started:.1f}s",
                  file=sys.stderr, flush=True)
    for values in extra.values():
        w.write_tensor_data(values)
    w.close()


def llama3_rope_factors(a) -> np.ndarray:
    """rope_freqs.weight as convert_hf_to_gguf makes it from a `llama3` rope_scaling (FACTOR,LOW,HIGH,
    ORIGINAL_CTX): per frequency, 1 above the high-frequency wavelength, FACTOR beyond the
    low-frequency one, and a smooth blend between. (head_dim / 2,) float32."""
    factor, low, high, original = (float(v) for v in a.llama3_rope.split(","))
    freqs = 1.0 / a.rope_base ** (np.arange(0, a.head_dim, 2, dtype=np.float64) / a.head_dim)
    wavelen = 2 * np.pi / freqs
    smooth = (original / wavelen - low) / (high - low)
    factors = np.where(wavelen < original / high, 1.0,
                       np.where(wavelen > original / low, factor, 1.0 / ((1 - smooth) / factor + smooth)))
    return factors.astype(np.float32)


def planned_type(role: str, shape, file_type: str) -> Q:
    if len(shape) == 1 or role == "router":  # norms, biases and routers stay F32, as llama.cpp keeps them
        return Q.F32
    qtype = tensor_type(role, file_type)
    return qtype if fits(qtype, shape[-1]) else (Q.Q8_0 if shape[-1] % 32 == 0 else Q.F16)


def planned_nbytes(qtype: Q, shape) -> int:
    n = int(np.prod(shape))
    if qtype in BLOCK:
        size, nbytes = BLOCK[qtype]
        return n // size * nbytes
    return n * (4 if qtype == Q.F32 else 2)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out")
    p.add_argument("--preset", choices=sorted(PRESETS))
    p.add_argument("--arch", choices=ARCHES, help="the model family (default: the preset's, else llama)")
    p.add_argument("--type", default="F16", choices=["F16", "BF16", "F32", "Q4_K_M", *(t.name for t in BLOCK)])
    for flag in ("layers", "dim", "ffn", "heads", "kv-heads", "head-dim", "ctx", "vocab", "experts", "experts-used",
                 "expert-ffn"):
        p.add_argument(f"--{flag}", type=int)
    p.add_argument("--rope-base", type=float)
    p.add_argument("--llama3-rope", metavar="FACTOR,LOW,HIGH,ORIGINAL_CTX",
                   help="Llama 3.1's rope scaling, written as its converter does: a rope_freqs.weight tensor")
    p.add_argument("--yarn", metavar="FACTOR,ORIGINAL_CTX", help="YaRN rope scaling keys (rope.scaling.*)")
    p.add_argument("--tied", action="store_true", help="no output.weight: the head is the embedding")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tokenizer", help="GGUF to take the tokenizer and chat template from (default: the default model)")
    p.add_argument("--chat-template", help="a Jinja file to use as the chat template instead")
    p.add_argument("--vocab-only", action="store_true",
                   help="write the tokenizer alone (no tensors): a small stand-in for --tokenizer on a machine "
                        "without the default model, from which the same synthetic files come out")
    return p


def resolve_shape(a: argparse.Namespace) -> argparse.Namespace:
    base = PRESETS.get(a.preset, {})
    for key in ("arch", "layers", "dim", "ffn", "heads", "kv_heads", "head_dim", "ctx", "rope_base", "vocab",
                "experts", "experts_used", "expert_ffn"):
        if getattr(a, key) is None:
            setattr(a, key, base.get(key))
    a.arch = a.arch or "llama"
    needed = ["layers", "dim", "heads", "kv_heads", "ctx"] + (["experts", "experts_used", "expert_ffn"]
                                                              if a.arch == "qwen3moe" else ["ffn"])
    missing = [k for k in needed if getattr(a, k) is None]
    if missing:
        raise SystemExit(f"make_synthetic_gguf: give --preset or --{missing[0].replace('_', '-')}")
    a.ffn = a.ffn or a.expert_ffn
    a.head_dim = a.head_dim or a.dim // a.heads
    if a.heads % a.kv_heads or a.head_dim % 2 or (a.arch == "llama" and a.dim % a.heads):
        raise SystemExit("make_synthetic_gguf: heads must split into kv heads, heads must be of even width")
    a.rope_base = a.rope_base or 10000.0
    return a


def main(argv=None) -> int:
    a = build_parser().parse_args(argv)
    if a.vocab_only:
        w = GGUFWriter(a.out, "llama")
        copy_tokenizer(w, GGUFReader(a.tokenizer or str(default_model_path())), None,
                       Path(a.chat_template).read_text() if a.chat_template else None)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        w.close()
        print(f"wrote {a.out} (the tokenizer alone)", file=sys.stderr)
        return 0
    a = resolve_shape(a)
    write_model(a)
    print(f"wrote {a.out} ({Path(a.out).stat().st_size / 2**30:.2f} GiB)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
