"""Tokenizer and chat template read from a GGUF file. No GPU imports: the server and the CLI use it.

Byte-level BPE is built with the `tokenizers` library from tokenizer.ggml.tokens/merges; the
chat template is rendered with jinja2 from tokenizer.chat_template.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment
from engine.modelfile.gguf_file import GGUFFile
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

from engine.modelfile.model_config import ModelLoadError, field_value
from engine.modelfile.token_segments import SegmentCache

CONTROL_TOKEN_TYPE = 3  # llama.cpp's LLAMA_TOKEN_TYPE_CONTROL
USER_DEFINED_TOKEN_TYPE = 4
# Control tokens that end a turn whatever the file's eos says (llama.cpp's end-of-generation set):
# an instruct model's eos is often <|endoftext|> while its turns end with <|im_end|> or <|eot_id|>.
END_OF_TURN = frozenset({"<|eot_id|>", "<|eom_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
                         "<|end_of_text|>"})

# The pre-tokenizers llama.cpp applies for each GGUF `tokenizer.ggml.pre` (llama-vocab.cpp), as
# regex splits before byte-level BPE. GPT-2's split as llama.cpp writes it:
GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
# Llama 3's (tiktoken-style; case-insensitive contractions spelled out, digits in runs of up to 3):
LLAMA3_SPLIT = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_SPLIT = LLAMA3_SPLIT.replace(r"\p{N}{1,3}", r"\p{N}")  # Qwen2's: the same, each digit alone


def _byte_level_alphabet() -> dict[str, int]:
    """Byte-level BPE's spelling of bytes: each byte is a printable character (itself for the printable
    Latin-1 ones, U+0100 onwards for the rest, in byte order). Character -> byte."""
    shown = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    hidden = [b for b in range(256) if b not in shown]
    return {chr(b): b for b in shown} | {chr(256 + i): b for i, b in enumerate(hidden)}


BYTE_OF = _byte_level_alphabet()


@dataclass(frozen=True)
class PreTokenizer:
    splits: tuple[str, ...]  # applied in turn, each piece kept ("isolated")
    ignore_merges: bool = False  # a piece that is itself a token is taken whole (llama.cpp: Llama 3)
    add_bos: bool = False  # llama.cpp's default when the file has no tokenizer.ggml.add_bos_token


PRE_TOKENIZERS = {
    "gpt2": PreTokenizer((GPT2_SPLIT,)),
    "smollm": PreTokenizer((r"\p{N}", GPT2_SPLIT)),  # each digit alone, then GPT-2's split
    "llama-bpe": PreTokenizer((LLAMA3_SPLIT,), ignore_merges=True, add_bos=True),
    "qwen2": PreTokenizer((QWEN2_SPLIT,)),
}
for alias, name in (("llama3", "llama-bpe"), ("llama-v3", "llama-bpe"), ("deepseek-r1-qwen", "qwen2")):
    PRE_TOKENIZERS[alias] = PRE_TOKENIZERS[name]  # names llama.cpp gives the same pre-tokenizer


@dataclass(frozen=True)
class SpecialTokens:
    bos: int | None
    eos: int
    eos_text: str
    bos_text: str
    add_bos: bool
    add_eos: bool = False  # tokenizer.ggml.add_eos_token: an embedding model's input ends with eos (Qwen3-Embedding's)


class GGUFTokenizer:
    def __init__(self, reader: GGUFFile):
        model = field_value(reader, "tokenizer.ggml.model", "?")
        pre = field_value(reader, "tokenizer.ggml.pre", "gpt2")
        if model != "gpt2" or pre not in PRE_TOKENIZERS:
            raise ModelLoadError(f"unsupported tokenizer {model!r} with pre-tokenizer {pre!r} "
                                 f"(supported: gpt2 with {', '.join(PRE_TOKENIZERS)})")
        tokens = field_value(reader, "tokenizer.ggml.tokens")
        types = field_value(reader, "tokenizer.ggml.token_type", [1] * len(tokens))
        merges = [tuple(x.split(" ", 1)) for x in field_value(reader, "tokenizer.ggml.merges")]
        self.tokens = tokens
        pre_tokenizer = PRE_TOKENIZERS[pre]
        self.tk = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges,
                                       ignore_merges=pre_tokenizer.ignore_merges))
        self.tk.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Split(Regex(split), behavior="isolated") for split in pre_tokenizer.splits]
            + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        self.tk.decoder = decoders.ByteLevel()
        # control tokens (<|im_end|>) are matched in text and never shown; user-defined ones (Qwen3's
        # <think>) are matched in text and shown, as llama.cpp renders them
        self.tk.add_special_tokens([AddedToken(t, special=True, normalized=False)
                                    for t, ty in zip(tokens, types) if ty == CONTROL_TOKEN_TYPE])
        self.tk.add_tokens([AddedToken(t, special=False, normalized=False)
                            for t, ty in zip(tokens, types) if ty == USER_DEFINED_TOKEN_TYPE])
        self.special_ids = frozenset(i for i, ty in enumerate(types) if ty == CONTROL_TOKEN_TYPE)
        self.added = {t: i for i, (t, ty) in enumerate(zip(tokens, types))
                      if ty in (CONTROL_TOKEN_TYPE, USER_DEFINED_TOKEN_TYPE)}  # text -> id of an added token
        bos = field_value(reader, "tokenizer.ggml.bos_token_id")
        eos = int(field_value(reader, "tokenizer.ggml.eos_token_id"))
        ends = {eos} | {int(field_value(reader, f"tokenizer.ggml.{k}_token_id")) for k in ("eot", "eom")
                        if field_value(reader, f"tokenizer.ggml.{k}_token_id") is not None}
        self.end_ids = frozenset(ends | {i for i in self.special_ids if tokens[i] in END_OF_TURN})
        self.special = SpecialTokens(bos, eos, tokens[eos], tokens[bos] if bos is not None else "",
                                     bool(field_value(reader, "tokenizer.ggml.add_bos_token", pre_tokenizer.add_bos)),
                                     bool(field_value(reader, "tokenizer.ggml.add_eos_token", False)))
        self.template = ChatTemplate(field_value(reader, "tokenizer.chat_template"), self.special)
        self.segments = self._segment_cache()

    def added_token_id(self, text: str) -> int | None:
        """The id of the added (control or user-defined) token spelled exactly `text`, if there is one
        (Qwen2.5's <tool_call>, Qwen3's <think>): a model writes such text as that one token."""
        return self.added.get(text)

    def token_bytes(self, token: int) -> bytes:
        """The bytes one token stands for (a piece of a character's UTF-8 for some): an added token's
        text as it is written, a byte-level token's spelling read back into bytes."""
        text = self.tokens[token]
        if text in self.added:
            return text.encode()
        return bytes(BYTE_OF[c] for c in text) if all(c in BYTE_OF for c in text) else text.encode()

    @property
    def vocab_size(self) -> int:
        return len(self.tokens)

    def encode(self, text: str, add_bos: bool | None = None, limit: int | None = None) -> list[int]:
        """Special tokens written in the text (e.g. <|im_start|>) become their ids, as in llama.cpp.
        limit: a text of more tokens raises TooManyTokens with its count, before its ids become a Python
        list (which holds the GIL: ~50 ms for 670K tokens on an idle core)."""
        out = self._bos(add_bos)
        for ids in self.segments.encode(text, None if limit is None else limit - len(out)):
            out.extend(ids)
        return out

    def count(self, text: str, add_bos: bool | None = None) -> int:
        """The number of tokens encode would give, without their ids as a list."""
        return len(self._bos(add_bos)) + sum(map(len, self.segments.encode(text)))

    def _bos(self, add_bos: bool | None) -> list[int]:
        wanted = self.special.add_bos if add_bos is None else add_bos
        return [self.special.bos] if wanted and self.special.bos is not None else []

    def _segment_cache(self) -> SegmentCache:
        """Texts tokenized in segments cut before control tokens, those seen before remembered
        (engine/modelfile/token_segments.py); whole, each text remembered as one segment, unless a probe of
        the template's kind tokenizes alike in segments. Every call goes through `tokenizers`' batch call,
        which lets go of the GIL while it works (its one-text encode holds it throughout, stalling the
        server's event loop even from a worker thread), and without the offsets nobody reads (building
        them holds the GIL again)."""
        control = [self.tokens[i] for i in sorted(self.special_ids)]
        cache = SegmentCache(self.tk, control, list(self.added))
        probe = "".join(f"{t}say 'hi' 12345 \n\n  x{t}{t} é\t" for t in control[:64]) + " end"
        return cache if cache.exact_on(probe) else SegmentCache(self.tk, [], [])

    def decode(self, ids: list[int]) -> str:
        return self.tk.decode(ids, skip_special_tokens=True)

    def stream(self) -> "DetokenizeStream":
        return DetokenizeStream(self.tk)

    def apply_chat_template(self, messages: list[dict], variables: dict | None = None,
                            tools: list[dict] | None = None, generation_prompt: bool = True) -> str:
        """variables: the request's chat_template_kwargs (e.g. enable_thinking for Qwen3); tools: the
        request's tool definitions (OpenAI shape), for templates that describe them; generation_prompt:
        whether the text ends with the assistant's opening (a chat request's always does)."""
        return self.template.render(messages, variables, tools, generation_prompt)


class DetokenizeStream:
    """Incremental detokenization that never emits a broken UTF-8 sequence."""

    def __init__(self, tk: Tokenizer):
        self.tk, self.stream = tk, decoders.DecodeStream(skip_special_tokens=True)

    def step(self, token: int) -> str:
        return self.stream.step(self.tk, token) or ""


class ChatTemplate:
    RESERVED = frozenset({"messages", "add_generation_prompt", "bos_token", "eos_token", "tools"})

    def __init__(self, source: str | None, special: SpecialTokens):
        self.special = special
        self.source = source or CHATML_FALLBACK
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = _raise_template_error
        env.globals["strftime_now"] = lambda fmt: time.strftime(fmt)  # Llama 3.x templates date their system prompt
        self.template = env.from_string(self.source)

    @property
    def thinks(self) -> bool:
        """Whether the model writes its reasoning in <think>...</think> (Qwen3, QwQ, DeepSeek-R1)."""
        return "<think>" in self.source

    def render(self, messages: list[dict], variables: dict | None = None, tools: list[dict] | None = None,
               generation_prompt: bool = True) -> str:
        """variables: extra template variables (chat_template_kwargs); not the ones set here."""
        variables = variables or {}
        reserved = self.RESERVED & variables.keys()
        if reserved:
            raise ValueError(f"chat_template_kwargs may not set {', '.join(sorted(reserved))}")
        try:
            return self.template.render(variables | {"messages": messages, "add_generation_prompt": generation_prompt,
                                                     "tools": tools,
                                                     "bos_token": self.special.bos_text,
                                                     "eos_token": self.special.eos_text})
        except jinja2.TemplateError as e:
            raise ValueError(f"chat template error: {e}") from e


def _raise_template_error(message: str):
    raise jinja2.TemplateError(message)


CHATML_FALLBACK = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
                   "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def load_tokenizer(path: str) -> GGUFTokenizer:
    return GGUFTokenizer(GGUFFile(path, "r"))
