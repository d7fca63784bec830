"""/tokenize, /detokenize and /infill (serve/http/text_api.py). Tokenizing on the default model's
vocabulary, through a server over the mock engine (tokenizing never reaches the engine) behind an API
key; fill-in-the-middle on the real Qwen2.5-Coder (tests/serve/conftest.py's qwen_server); the FIM
prompt's layout on Qwen's vocabulary in process."""
from __future__ import annotations

import json
from types import SimpleNamespace

import httpx
import openai
import pytest

from engine.modelfile.tokenizer import load_tokenizer
from serve.api.infill import NO_FIM, infill_tokens
from serve.api.prompt_fit import PromptFit
from serve.api.tokenize import text_ids
from tests.harness import ROOT, ServerProcess, mock_engine_cmd
from tools.fixtures.fetch_fixture import fixture_path

KEY = {"authorization": "Bearer text-key"}
TEXT = "Hello, wörld! 漢字 <|im_end|> done"  # 漢 is three tokens of one byte each in SmolLM2's vocabulary
CHAT = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name a colour."}]
PREFIX, SUFFIX = "def add(a, b):\n    return ", "\n\nprint(add(1, 2))\n"
UTIL = ("util.py", "def sub(a, b):\n    return a - b\n")


@pytest.fixture(scope="module")
def server():
    with ServerProcess(engine_cmd=mock_engine_cmd("--chunk-s", "0.005", "--token-s", "0.002"),
                       api_key="text-key") as s:
        yield s


@pytest.fixture(scope="module")
def post(server):
    return lambda path, body: httpx.post(server.url + path, json=body, headers=KEY, timeout=60)


def piece_bytes(piece: str | list[int]) -> bytes:
    return piece.encode() if isinstance(piece, str) else bytes(piece)


def test_tokens_round_trip_to_the_text(post, server, tokenizer):
    r = post("/tokenize", {"content": TEXT}).json()
    assert r["tokens"] == tokenizer.encode(TEXT, add_bos=False) and r["count"] == len(r["tokens"])
    assert tokenizer.added_token_id("<|im_end|>") in r["tokens"]  # parse_special: true by default
    ctx = httpx.get(server.url + "/status", headers=KEY).json()["engine_info"]["ctx"]
    assert r["max_model_len"] == int(ctx)
    assert post("/detokenize", {"tokens": r["tokens"]}).json() == {"content": TEXT, "prompt": TEXT}


def test_pieces_join_to_the_text(post):
    ids = post("/tokenize", {"content": TEXT}).json()["tokens"]
    pieces = post("/tokenize", {"content": TEXT, "with_pieces": True}).json()["tokens"]
    assert [p["id"] for p in pieces] == ids
    assert b"".join(piece_bytes(p["piece"]) for p in pieces) == TEXT.encode()
    assert any(isinstance(p["piece"], list) for p in pieces)  # a part of a character comes as its bytes
    assert {"id": ids[-1], "piece": " done"} == pieces[-1]


def test_parse_special_false_reads_control_tokens_as_text(post, tokenizer):
    literal = post("/tokenize", {"content": TEXT, "parse_special": False}).json()["tokens"]
    assert tokenizer.added_token_id("<|im_end|>") not in literal
    assert len(literal) > len(tokenizer.encode(TEXT, add_bos=False))
    assert post("/detokenize", {"tokens": literal}).json()["content"] == TEXT


def test_add_special_adds_the_bos_only_where_the_model_adds_one(post, tokenizer):
    assert not tokenizer.special.add_bos  # SmolLM2: a BOS id, not added
    plain = post("/tokenize", {"content": "Hi"}).json()["tokens"]
    assert post("/tokenize", {"content": "Hi", "add_special": True}).json()["tokens"] == plain
    assert post("/tokenize", {"prompt": "Hi", "add_special_tokens": True}).json()["tokens"] == plain
    llama = SimpleNamespace(tokenizer=load_tokenizer(str(ROOT / "tests/fixtures/vocab/ggml-vocab-llama-bpe.gguf")))
    bos = llama.tokenizer.special.bos
    assert text_ids(llama, "Hi", True, True) == [bos, *text_ids(llama, "Hi", False, True)]
    assert bos not in text_ids(llama, "Hi", False, True)


def test_chat_messages_count_as_the_chat_completion_reads_them(post):
    r = post("/tokenize", {"messages": CHAT}).json()
    read = post("/v1/chat/completions", {"messages": CHAT, "max_tokens": 1}).json()["usage"]["prompt_tokens"]
    assert r["count"] == len(r["tokens"]) == read
    bare = post("/tokenize", {"messages": CHAT, "add_generation_prompt": False}).json()["tokens"]
    opening = post("/tokenize", {"content": "<|im_start|>assistant\n", "add_special": False}).json()["tokens"]
    assert bare + opening == r["tokens"]  # the same conversation without the assistant's opening


def test_ids_outside_the_vocabulary_and_bad_bodies_are_400(post, server, tokenizer):
    for ids in ([1, tokenizer.vocab_size], [-1]):
        r = post("/detokenize", {"tokens": ids})
        assert r.status_code == 400 and r.json()["error"]["param"] == "tokens", r.text
    assert post("/tokenize", {}).status_code == 400
    assert post("/tokenize", {"content": "a", "prompt": "b"}).status_code == 400
    assert httpx.post(server.url + "/tokenize", json={"content": "a"}).status_code == 401


def test_infill_is_refused_for_a_model_without_fim_tokens(post, tokenizer):
    assert tokenizer.added_token_id("<|fim_prefix|>") is None and tokenizer.added_token_id("<fim_prefix>") is None
    r = post("/infill", {"input_prefix": PREFIX, "input_suffix": SUFFIX})
    assert r.status_code == 400 and r.json()["error"]["message"] == NO_FIM


# ---------------------------------------------------------------- fill-in-the-middle on Qwen2.5-Coder

@pytest.fixture(scope="module")
def qwen_tokenizer():
    return load_tokenizer(str(fixture_path()))


def fim_prompt(tk, *files: tuple[str, str]) -> list[int]:
    """The prompt written out as text, read with its special tokens."""
    repo = "".join(f"<|file_sep|>{name}\n{text}" for name, text in files)
    head = f"<|repo_name|>myproject\n{repo}<|file_sep|>filename\n" if files else ""
    return tk.encode(f"{head}<|fim_prefix|>{PREFIX}<|fim_suffix|>{SUFFIX}<|fim_middle|>", add_bos=False)


def test_the_prompt_is_llama_servers_layout(qwen_tokenizer):
    state, fit = SimpleNamespace(tokenizer=qwen_tokenizer, ctx=4096), PromptFit.of(qwen_tokenizer)
    other = ("other.py", "x = 1\n")
    assert infill_tokens(state, fit, PREFIX, SUFFIX, [], "") == fim_prompt(qwen_tokenizer)
    assert infill_tokens(state, fit, PREFIX, SUFFIX, [other, UTIL], "") == fim_prompt(qwen_tokenizer, other, UTIL)
    # what is typed at the cursor ends the prefix
    assert infill_tokens(state, fit, "def add(a, b):\n", SUFFIX, [], "    return ") == fim_prompt(qwen_tokenizer)
    # the latest files that fit in the context, less the answer's room
    room = len(fim_prompt(qwen_tokenizer, UTIL)) + 1
    small = SimpleNamespace(tokenizer=qwen_tokenizer, ctx=room + 100)
    assert infill_tokens(small, fit, PREFIX, SUFFIX, [other, UTIL], "", 100) == fim_prompt(qwen_tokenizer, UTIL)
    assert infill_tokens(small, fit, PREFIX, SUFFIX, [UTIL, ("big.py", "y = 2\n" * 50)], "", 100) == \
        fim_prompt(qwen_tokenizer)


@pytest.fixture(scope="module")
def whole(qwen_server):
    body = {"input_prefix": PREFIX, "input_suffix": SUFFIX, "temperature": 0, "n_predict": 16}
    return body, httpx.post(qwen_server.url + "/infill", json=body, timeout=300).json()


def test_infill_fills_in_the_obvious_body(whole, qwen_tokenizer):
    _, r = whole
    assert r["content"].startswith("a + b\n"), r  # greedy: "a + b\n\nprint(add(5, 3))", then its end of text
    assert r["stop"] is True and r["stop_type"] == "eos" and 0 < r["tokens_predicted"] < 16
    assert r["tokens_evaluated"] == len(fim_prompt(qwen_tokenizer))
    assert r["timings"]["predicted_n"] == r["tokens_predicted"] and r["timings"]["prompt_n"] > 0


def test_infill_streamed_is_the_whole_text(whole, qwen_server):
    body, r = whole
    with httpx.stream("POST", qwen_server.url + "/infill", json=body | {"stream": True}, timeout=300) as s:
        chunks = [json.loads(line[6:]) for line in s.iter_lines() if line.startswith("data: ")]
    assert [c["stop"] for c in chunks] == [False] * (len(chunks) - 1) + [True]
    assert "".join(c["content"] for c in chunks) == r["content"]
    assert chunks[-1]["tokens_predicted"] == r["tokens_predicted"]


def test_a_time_limit_ends_the_answer_at_its_first_new_line_past_it(whole, qwen_server):
    """llama-server's t_max_predict_ms (llama.vim sends it): the answer ends at the first new line it
    writes once it is that long past its first token, the rest of the greedy answer not drawn."""
    body, r = whole
    limited = httpx.post(qwen_server.url + "/infill", json=body | {"t_max_predict_ms": 1}, timeout=300).json()
    assert limited["stop_type"] == "limit" and limited["content"].endswith("\n"), limited
    assert r["content"].startswith(limited["content"]) and limited["tokens_predicted"] < r["tokens_predicted"]


def test_infill_reads_the_project_files(qwen_server, qwen_tokenizer):
    body = {"input_prefix": PREFIX, "input_suffix": SUFFIX, "temperature": 0, "n_predict": 4,
            "input_extra": [{"filename": UTIL[0], "text": UTIL[1]}]}
    r = httpx.post(qwen_server.url + "/infill", json=body, timeout=300).json()
    assert r["content"].startswith("a + b"), r
    assert r["tokens_evaluated"] == len(fim_prompt(qwen_tokenizer, UTIL))


def test_completions_suffix_fills_in_the_middle_as_infill_does(whole, qwen_server):
    """FIM through /v1/completions' `suffix` (the OpenAI client's), the same prompt and text as /infill's."""
    _, r = whole
    client = openai.OpenAI(base_url=qwen_server.url + "/v1", api_key="unused", max_retries=0, timeout=300)
    done = client.completions.create(model="qwen", prompt=PREFIX, suffix=SUFFIX, max_tokens=16, temperature=0)
    assert done.choices[0].text == r["content"] and done.usage.prompt_tokens == r["tokens_evaluated"]


def test_llama_vims_requests_warm_the_cache_and_take_only_their_fields(qwen_server):
    """llama.vim's two requests as it sends them: a warm-up of its ring of chunks (empty prefix and
    suffix, n_predict 0, chunks with a time) that reads the prompt and shows nothing, and a completion
    with its samplers, time limits and response_fields, which gets only those fields."""
    lines = "".join(f"def f{i}(x):\n    return x + {i}\n\n" for i in range(14))  # some 190 tokens: whole blocks
    chunks = [{"text": lines, "time": 1733300000.0, "filename": "more.py"}]
    warm = httpx.post(qwen_server.url + "/infill", timeout=300, json={
        "input_prefix": "", "input_suffix": "", "input_extra": chunks, "prompt": "", "n_predict": 0,
        "temperature": 0.0, "stream": False, "samplers": ["temperature"], "cache_prompt": True,
        "t_max_prompt_ms": 1, "t_max_predict_ms": 1}).json()
    assert warm["content"] == "" and warm["tokens_predicted"] == 0 and warm["tokens_evaluated"] > 0
    fields = ["content", "timings/prompt_n", "timings/predicted_n", "tokens_cached"]
    r = httpx.post(qwen_server.url + "/infill", timeout=300, json={
        "input_prefix": PREFIX, "input_suffix": SUFFIX, "input_extra": chunks, "prompt": "", "n_predict": 4,
        "stop": [], "n_indent": 4, "top_k": 40, "top_p": 0.90, "stream": False, "samplers": ["top_k", "top_p", "infill"],
        "cache_prompt": True, "t_max_prompt_ms": 500, "t_max_predict_ms": 500, "response_fields": fields}).json()
    assert set(r) == set(fields) and r["content"] and r["timings/predicted_n"] <= 4
    assert r["tokens_cached"] >= 128  # the chunks the warm-up read were not read again
