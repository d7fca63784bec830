"""serve/api/sampling_defaults.py: a request that leaves a sampling field out gets the model's default
from its GGUF (general.sampling.*), else llama.cpp's, and the server's flags over both; a field the
request gives wins. Checked on GGUF files written here with and without those keys, and on the
engine-bound request the server builds."""
from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

import gguf
import pytest

from serve.api import openai_schema as schema
from serve.config import ServerSettings
from serve.http.run_request import build_request
from engine.modelfile.gguf_file import GGUFFile
from serve.api.sampling_defaults import LLAMA_CPP, sampling_defaults


def write_gguf(path, **sampling) -> str:
    writer = gguf.GGUFWriter(str(path), "llama")
    for key, value in sampling.items():
        (writer.add_uint32 if key == "top_k" else writer.add_float32)(f"general.sampling.{key}", value)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    return str(path)


def test_the_model_s_own_defaults_then_llama_cpp_s_then_the_flags(tmp_path):
    plain = write_gguf(tmp_path / "plain.gguf")
    assert sampling_defaults(GGUFFile(plain, "r"), {}) == LLAMA_CPP
    tuned = write_gguf(tmp_path / "tuned.gguf", temp=0.6, top_k=20)
    got = sampling_defaults(GGUFFile(tuned, "r"), {"temperature": None, "top_p": 0.8})
    assert got["temperature"] == pytest.approx(0.6) and got["top_k"] == 20
    assert (got["top_p"], got["min_p"]) == (0.8, LLAMA_CPP["min_p"])


def test_a_request_s_own_fields_win_and_the_rest_come_from_the_defaults(tmp_path):
    settings = ServerSettings(model_path=tmp_path / "m.gguf", sampling={"temperature": 0.3, "top_k": 7, "top_p": 0.9,
                                                                       "min_p": 0.1})
    state = SimpleNamespace(ctx=512, settings=settings, scheduler=SimpleNamespace(waiting=[]),
                            tokenizer=SimpleNamespace(vocab_size=100))
    body = schema.ChatCompletionRequest(messages=[{"role": "user", "content": "hi"}], top_k=3, seed=5)
    sampling = build_request(state, body, [1, 2, 3], 8).sampling
    assert (sampling["temperature"], sampling["top_k"], sampling["top_p"], sampling["min_p"]) == (0.3, 3, 0.9, 0.1)
    assert sampling["seed"] == 5
    greedy = schema.ChatCompletionRequest(messages=[{"role": "user", "content": "hi"}], temperature=0)
    assert build_request(state, greedy, [1], 8).sampling["temperature"] == 0


def test_a_default_out_of_range_is_a_clear_error_at_start():
    done = subprocess.run([sys.executable, "-m", "serve", "--top-p", "3"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "top_p 3.0" in done.stderr, done.stderr
