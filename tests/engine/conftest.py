import numpy as np
import pytest

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
