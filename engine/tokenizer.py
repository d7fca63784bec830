"""Tokenizer and chat template read from a GGUF file. No GPU imports: the server and the CLI use it.

Byte-level BPE is built with the `tokenizers` library from tokenizer.ggml.tokens/merges; the
chat template is rendered with jinja2 from tokenizer.chat_template.
"""
from __future__ import annotations

from dataclasses import dataclass

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment
from gguf import GGUFReader
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

from engine.gguf_model import ModelLoadError, field_value, read_config

CONTROL_TOKEN_TYPE = 3  # llama.cpp's LLAMA_TOKEN_TYPE_CONTROL
USER_DEFINED_TOKEN_TYPE = 4

# GPT-2's split, as llama.cpp writes it; 'smollm' (and 'gpt2'-family) pre-tokenizers use it.
GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
PRE_TOKENIZERS = {
    # llama.cpp: "\p{N}" (each digit alone) then the GPT-2 split
    "smollm": lambda: pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r"\p{N}"), behavior="isolated"),
        pre_tokenizers.Split(Regex(GPT2_SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]),
    "gpt2": lambda: pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(GPT2_SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]),
}


@dataclass(frozen=True)
class SpecialTokens:
    bos: int | None
    eos: int
    eos_text: str
    bos_text: str
    add_bos: bool


class GGUFTokenizer:
    def __init__(self, reader: GGUFReader):
        model = field_value(reader, "tokenizer.ggml.model", "?")
        pre = field_value(reader, "tokenizer.ggml.pre", "gpt2")
        if model != "gpt2" or pre not in PRE_TOKENIZERS:
            raise ModelLoadError(f"unsupported tokenizer {model!r} with pre-tokenizer {pre!r} "
                                 f"(supported: gpt2 with {', '.join(PRE_TOKENIZERS)})")
        tokens = field_value(reader, "tokenizer.ggml.tokens")
        types = field_value(reader, "tokenizer.ggml.token_type", [1] * len(tokens))
        merges = [tuple(x.split(" ", 1)) for x in field_value(reader, "tokenizer.ggml.merges")]
        self.tokens = tokens
        self.tk = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges,
                                       ignore_merges=False))
        self.tk.pre_tokenizer = PRE_TOKENIZERS[pre]()
        self.tk.decoder = decoders.ByteLevel()
        special = [t for t, ty in zip(tokens, types) if ty in (CONTROL_TOKEN_TYPE, USER_DEFINED_TOKEN_TYPE)]
        self.tk.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in special])
        self.special_ids = frozenset(i for i, ty in enumerate(types) if ty == CONTROL_TOKEN_TYPE)
        bos = field_value(reader, "tokenizer.ggml.bos_token_id")
        eos = int(field_value(reader, "tokenizer.ggml.eos_token_id"))
        self.special = SpecialTokens(bos, eos, tokens[eos], tokens[bos] if bos is not None else "",
                                     bool(field_value(reader, "tokenizer.ggml.add_bos_token", False)))
        self.template = ChatTemplate(field_value(reader, "tokenizer.chat_template"), self.special)

    @property
    def vocab_size(self) -> int:
        return len(self.tokens)

    def encode(self, text: str, add_bos: bool | None = None) -> list[int]:
        """Special tokens written in the text (e.g. <|im_start|>) become their ids, as in llama.cpp."""
        ids = self.tk.encode(text, add_special_tokens=False).ids
        bos = self.special.add_bos if add_bos is None else add_bos
        return ([self.special.bos] if bos and self.special.bos is not None else []) + ids

    def decode(self, ids: list[int]) -> str:
        return self.tk.decode(ids, skip_special_tokens=True)

    def stream(self) -> "DetokenizeStream":
        return DetokenizeStream(self.tk)

    def apply_chat_template(self, messages: list[dict]) -> str:
        return self.template.render(messages)


class DetokenizeStream:
    """Incremental detokenization that never emits a broken UTF-8 sequence."""

    def __init__(self, tk: Tokenizer):
        self.tk, self.stream = tk, decoders.DecodeStream(skip_special_tokens=True)

    def step(self, token: int) -> str:
        return self.stream.step(self.tk, token) or ""


class ChatTemplate:
    def __init__(self, source: str | None, special: SpecialTokens):
        self.special = special
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = _raise_template_error
        self.template = env.from_string(source or CHATML_FALLBACK)

    def render(self, messages: list[dict]) -> str:
        try:
            return self.template.render(messages=messages, add_generation_prompt=True,
                                        bos_token=self.special.bos_text, eos_token=self.special.eos_text)
        except jinja2.TemplateError as e:
            raise ValueError(f"chat template error: {e}") from e


def _raise_template_error(message: str):
    raise jinja2.TemplateError(message)


CHATML_FALLBACK = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
                   "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def load_tokenizer(path: str) -> GGUFTokenizer:
    return GGUFTokenizer(GGUFReader(path, "r"))


def load_tokenizer_and_ctx(path: str) -> tuple[GGUFTokenizer, int]:
    """The tokenizer and the context the engine uses by default, from one read of the file."""
    reader = GGUFReader(path, "r")
    return GGUFTokenizer(reader), read_config(reader).default_ctx
