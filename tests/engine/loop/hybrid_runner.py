"""The real runner over a tiny qwen3next file on the CPU, for tests that drive the engine's loop in process: its
rows are the same in any step there (shape_free), so its reads share steps and answers are read again; and the same
over a small synthetic model of the default model's type (small_runner), whose reads end anywhere."""
import subprocess
import sys

from engine.model.weights import load_model
from engine.ops.backend import cpu_backend
from engine.runner.runner import ModelRunner
from protocol import messages as m
from tests.engine.model.test_hybrid import CHUNK, ROOT, SHAPE


def hybrid_runner(folder, max_running: int) -> ModelRunner:
    """A warmed-up runner (a 1,024-token context, CHUNK-row chunks) of a qwen3next file written into `folder`."""
    path = folder / "qwen3next.gguf"
    subprocess.run([sys.executable, str(ROOT / "tools/fixtures/make_synthetic_gguf.py"), str(path), "--arch",
                    "qwen3next", *SHAPE, "--seed", "7"], check=True, capture_output=True)
    backend = cpu_backend()
    cfg, weights, _ = load_model(str(path), backend)
    runner = ModelRunner(cfg, weights, backend, ctx=1024, chunk=CHUNK, eos_ids=frozenset(), max_running=max_running)
    runner.warm_up()
    assert runner.shape_free
    return runner


SMALL_BLOCK, SMALL_CHUNK = 16, 64  # small_runner's KV block and prompt chunk, in positions


def small_runner(path: str, blocks: int, **extra) -> ModelRunner:
    """A warmed-up runner of the small Q4_1 file at `path` (tests/engine/conftest.py small_q4_1): a 256-token
    context, chunks of SMALL_CHUNK, blocks of SMALL_BLOCK, `blocks` of them, four requests at once; extra: ModelRunner's other
    arguments."""
    backend = cpu_backend()
    cfg, weights, _ = load_model(path, backend)
    runner = ModelRunner(cfg, weights, backend, ctx=256, chunk=SMALL_CHUNK, eos_ids=frozenset(), max_running=4,
                         block_size=SMALL_BLOCK, blocks=blocks, **extra)
    runner.warm_up()
    assert runner.shape_free
    return runner


def serve_until_idle(loop, first: list, then: list, out: list) -> list:
    """The engine loop's rounds for the GEN lines `first` given at once and `then` after the first round, until
    nothing is left to do: out, its lines, none an ERR or a DEFER."""
    for gen in first:
        loop.control(gen)
    while loop.busy or not loop.inbox.empty():
        loop.take_lines(block=False)
        loop.round()
        for gen in then:
            loop.control(gen)
        then = []
    assert not any(isinstance(x, (m.Err, m.Defer)) for x in out), out
    return out


def tokens(out: list, ident: int) -> list[int]:
    """The tokens of request `ident` among the loop's lines."""
    return [x.token for x in out if isinstance(x, m.Token) and x.id == ident]
