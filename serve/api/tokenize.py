"""What /tokenize and /detokenize answer (serve/http/text_api.py): a text's tokens, with its control
tokens' text read as those tokens or as plain text; a chat's tokens as /v1/chat/completions reads
them; each token's piece; token ids back to text."""
from __future__ import annotations

from tokenizers import Tokenizer

from serve.api.chat import tool_plan
from serve.api.errors import APIError
from serve.api.prompt_fit import PromptFit
from serve.api.prompt_tokens import chat_tokens
from serve.api.text_schema import TokenizeRequest


class LiteralTokenizer:
    """The model's tokenizer reading control tokens' text (<|im_end|>) as plain text, as llama.cpp's
    parse_special=false does (user-defined tokens, Qwen2.5's <tool_call>, are still matched, as there).
    A copy of the `tokenizers` Tokenizer with encode_special_tokens set, not the shared one switched
    (another thread may be encoding with it); built once on first use (~0.7 s for a 152K vocabulary)."""

    def __init__(self, tokenizer):
        self.source, self._built = tokenizer, None

    def encode(self, text: str) -> list[int]:
        if self._built is None:
            built = Tokenizer.from_str(self.source.tk.to_str())
            built.encode_special_tokens = True
            self._built = built
        return self._built.encode_batch_fast([text], add_special_tokens=False)[0].ids


def text_ids(state, text: str, add_special: bool, parse_special: bool) -> list[int]:
    """add_special: the model's BOS where the model adds one (tokenizer.ggml.add_bos_token), as
    llama-server's add_special and vLLM's add_special_tokens."""
    tokenizer = state.tokenizer
    special = tokenizer.special
    bos = [special.bos] if add_special and special.add_bos and special.bos is not None else []
    return bos + (tokenizer.encode(text, add_bos=False) if parse_special else state.literal_tokenizer.encode(text))


def request_ids(state, fit: PromptFit, body: TokenizeRequest) -> list[int]:
    if body.messages is None:
        text = body.content if body.content is not None else body.prompt
        return text_ids(state, text, body.wants_special(), body.parse_special)
    chat = body.chat()
    return chat_tokens(state, fit, chat, tool_plan(state, chat), body.add_generation_prompt)[1]


def checked(tokenizer, ids: list[int]) -> list[int]:
    bad = next((t for t in ids if not 0 <= t < tokenizer.vocab_size), None)
    if bad is not None:
        raise APIError(400, f"token id {bad} is not in the vocabulary (0 to {tokenizer.vocab_size - 1})",
                       param="tokens")
    return ids


def pieces(tokenizer, ids: list[int]) -> list[dict]:
    """Each token with its text; a token holding part of a character has its bytes instead (as
    llama-server gives them), so that the pieces' bytes joined are the text's."""
    out = []
    for token in ids:
        raw = tokenizer.token_bytes(token)
        try:
            out.append({"id": token, "piece": raw.decode("utf-8")})
        except UnicodeDecodeError:
            out.append({"id": token, "piece": list(raw)})
    return out


def tokenize(state, fit: PromptFit, body: TokenizeRequest) -> dict:
    """llama-server's body ({"tokens"}) with vLLM's fields beside it (count, max_model_len)."""
    ids = request_ids(state, fit, body)
    return {"tokens": pieces(state.tokenizer, ids) if body.with_pieces else ids, "count": len(ids),
            "max_model_len": state.ctx}


def detokenize(tokenizer, ids: list[int]) -> dict:
    """The text the ids spell, control tokens included (as llama-server and vLLM show them): the bytes
    of every token, read as UTF-8. Under both names: llama-server's `content`, vLLM's `prompt`."""
    text = b"".join(tokenizer.token_bytes(t) for t in checked(tokenizer, ids)).decode("utf-8", errors="replace")
    return {"content": text, "prompt": text}
