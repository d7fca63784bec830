"""Fill-in-the-middle prompts: the code before and after the cursor around the model's FIM tokens
(found by their text in the vocabulary, as llama.cpp finds them), after the project's other files,
where the request gives some, in the repository-level form Qwen2.5-Coder was trained on:

    <|repo_name|>myproject\n
    <|file_sep|>{filename}\n{text}        (each file of input_extra)
    <|file_sep|>filename\n
    <|fim_prefix|>{prefix}{typed}<|fim_suffix|>{suffix}<|fim_middle|>

in the order and with the placeholder names of llama-server's /infill (format_infill in its
tools/server; prefix-suffix-middle). Two differences: without files the prompt is the plain
<|fim_prefix|>...<|fim_middle|> (llama-server writes the repository lines even then; Qwen2.5-Coder-0.5B-
Instruct, given them, runs on past the middle into prose, and stops without them), and a model's BOS
comes first rather than after the files. `typed` (its request's `prompt`) ends the prefix: the
README puts it after <|fim_middle|>, the code before <|fim_suffix|>, which is followed here. Without
<|file_sep|> the files come as text snippets before <|fim_prefix|>, as there.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from serve.api.errors import APIError
from serve.api.prompt_fit import PromptFit

# each role's token, under the names the families give it (llama.cpp's llama-vocab.cpp)
FIM_NAMES = {
    "prefix": ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<PRE>", "▁<PRE>", "<|code_prefix|>"),
    "suffix": ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<SUF>", "▁<SUF>", "<|code_suffix|>"),
    "middle": ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<MID>", "▁<MID>", "<|code_middle|>"),
    "pad": ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>"),
    "repo": ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    "file_sep": ("<|file_sep|>",),
}
REPO_NAME, CURRENT_FILE = "myproject", "filename"  # llama-server's placeholders
SNIPPET = "\n\n--- snippet ---\n\n"  # a file's opening without <|file_sep|>
NO_FIM = "this model has no fill-in-the-middle tokens"


@dataclass(frozen=True)
class FimTokens:
    prefix: int
    suffix: int
    middle: int
    pad: int | None
    repo: int | None
    file_sep: int | None

    @property
    def ends(self) -> tuple[int, ...]:
        """Tokens that end the middle besides the model's end of text (llama.cpp's end-of-generation
        set has them): a model that pads, or opens another file, is done."""
        return tuple(t for t in (self.pad, self.repo, self.file_sep) if t is not None)


def fim_tokens(tokenizer) -> FimTokens:
    """The model's FIM tokens; a model without prefix, suffix and middle tokens is refused (400)."""
    found = {role: next((i for name in names if (i := tokenizer.added_token_id(name)) is not None), None)
             for role, names in FIM_NAMES.items()}
    if None in (found["prefix"], found["suffix"], found["middle"]):
        raise APIError(400, NO_FIM, code="fim_not_supported")
    return FimTokens(**found)


def infill_tokens(state, fit: PromptFit, prefix: str, suffix: str, extra: list[tuple[str, str]], middle: str,
                  reserve: int = 0) -> list[int]:
    """The prompt that asks the model for the code between `prefix` and `suffix`; `middle`: what is
    already typed at the cursor (it ends the prefix); `extra`: (filename, text) of other files, latest
    last. The prefix, suffix and middle are kept whole (too long for the context: 400, from
    build_request); of the files, the latest that fit in what is left of the context after `reserve`
    tokens for the answer (llama-server fills the rest of its context with them too)."""
    fim = fim_tokens(state.tokenizer)
    fit.check(prefix + middle + suffix, state.ctx)
    encode = lambda text: state.tokenizer.encode(text, add_bos=False)  # noqa: E731
    special = state.tokenizer.special
    bos = [special.bos] if special.add_bos and special.bos is not None else []
    core = [fim.prefix, *encode(prefix), *encode(middle), fim.suffix, *encode(suffix), fim.middle]
    room = state.ctx - 1 - reserve - len(bos) - len(core)
    return bos + project_files(fim, encode, extra, room, fit.longest_token_bytes) + core


def project_files(fim: FimTokens, encode: Callable[[str], list[int]], extra: list[tuple[str, str]], room: int,
                  longest_token_bytes: int) -> list[int]:
    """The files before the FIM part, in the repository form where the model has its tokens; nothing
    when none fits."""
    head = [fim.repo, *encode(REPO_NAME + "\n")] if fim.repo is not None and extra else []
    tail = [fim.file_sep, *encode(CURRENT_FILE + "\n")] if fim.file_sep is not None and extra else []
    files = files_that_fit(fim, encode, extra, room - len(head) - len(tail), longest_token_bytes)
    return head + files + tail if files else []


def files_that_fit(fim: FimTokens, encode: Callable[[str], list[int]], extra: list[tuple[str, str]], room: int,
                   longest_token_bytes: int) -> list[int]:
    """The latest files whose tokens fit in `room`, whole, in their order; the first that does not fit
    ends the search (a text of more characters than room x the longest token is not even tokenized)."""
    kept: list[list[int]] = []
    for name, text in reversed(extra):
        if len(text) > room * longest_token_bytes:
            break
        ids = ([fim.file_sep, *encode(name + "\n")] if fim.file_sep is not None else encode(SNIPPET)) + encode(text)
        if len(ids) > room:
            break
        kept.append(ids)
        room -= len(ids)
    return [t for ids in reversed(kept) for t in ids]
