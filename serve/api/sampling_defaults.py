"""What a request samples with when it leaves a field out: the model's own defaults where its GGUF
carries them (`general.sampling.*`, the keys llama.cpp reads), else llama.cpp's server defaults, and
the server's --temp / --top-k / --top-p / --min-p over both.

OpenAI's API defaults to temperature 1.0 with nothing trimmed, which suits its own large models; a
small local model drawn that way misspells tool names and wanders. Local servers (llama.cpp, ollama)
default to a cooler, trimmed draw, and a client that sends no sampling fields (llama.cpp's own test
scripts, many agents) gets what those servers would give it.
"""
from __future__ import annotations

from engine.modelfile.gguf_file import GGUFFile

LLAMA_CPP = {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05}
GGUF_KEYS = {"general.sampling.temp": "temperature", "general.sampling.top_k": "top_k",
             "general.sampling.top_p": "top_p", "general.sampling.min_p": "min_p"}


def model_defaults(reader: GGUFFile) -> dict[str, float]:
    out = {}
    for key, name in GGUF_KEYS.items():
        field = reader.fields.get(key)
        if field is not None:
            value = field.contents()
            out[name] = int(value) if name == "top_k" else float(value)
    return out


def sampling_defaults(reader: GGUFFile, flags: dict[str, float | None]) -> dict[str, float]:
    """reader: the model's file; flags: the server's --temp / --top-k / --top-p / --min-p (None: not given)."""
    given = {k: v for k, v in flags.items() if v is not None}
    return LLAMA_CPP | model_defaults(reader) | given
