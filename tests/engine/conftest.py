import numpy as np
import pytest

from tools.fixtures.make_synthetic_gguf import main as make_synthetic

from engine.ops.backend import cpu_backend
from engine.model.weights import load_model
from engine.kvcache.kv import KVCache
from engine.model.forward import LlamaModel


class LoadedModel:
    def __init__(self, path: str):
        self.backend = cpu_backend()
        self.cfg, self.weights, _ = load_model(path, self.backend)
        self.model = LlamaModel(self.cfg, self.weights, self.backend)

    def logits_after(self, ids, chunk: int, ctx: int = 1024):
        """Read `ids` in absolute chunks of `chunk` into a fresh cache; logits of the last position."""
        return self.model.prefill(np.asarray(ids), KVCache(self.cfg, ctx, self.backend), chunk)


@pytest.fixture(scope="session")
def loaded(model_path) -> LoadedModel:
    return LoadedModel(model_path)


@pytest.fixture(scope="session")
def small_q4_1(tmp_path_factory) -> str:
    """A two-layer synthetic model of the default model's block type (Q4_1) and vocabulary, whose heads and FFN
    split over three ranks: for what loading a model does at any size (the expanded-weight cache, a shard's split)
    without the default model's float32 expansion each time (a second or more on the 2-core machine)."""
    path = str(tmp_path_factory.mktemp("small") / "small-q4_1.gguf")
    make_synthetic([path, "--layers", "2", "--dim", "192", "--ffn", "384", "--heads", "3", "--kv-heads", "3",
                    "--ctx", "256", "--type", "Q4_1"])
    return path
