"""A decode forward's sampling rows drawn right behind it on the GPU (engine/runner/picks.py DrawsBehind, the
runner's runs_async) against the draws at the next step (runs_async off, as before): the engine's own loop over
a model's file on the GPU, 96 requests at once (seeded draws at the servers' top_k 40, top_p, min_p; greedy ones;
some asking log-probabilities; answers of different lengths, so the batch shrinks; steps of two forwards, 64 rows
and the rest, so the first forward's requests are set aside: Picks.set_aside), then the same in a KV pool too small
for them (requests paused and back): every request's lines the same both ways and the same as alone (every eighth
request served by itself), and tokens drawn behind.

    python tools/device/draws_behind_check.py MODEL.gguf [--json FILE] [--device cpu]

Exit status 0 when every check passes.
"""
from __future__ import annotations

import argparse
import sys
from functools import partial
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from engine.ops.blas_order import prefer_row_invariant_blas  # noqa: E402
from protocol import messages as m  # noqa: E402
from tools.device.model_checks import report  # noqa: E402

prefer_row_invariant_blas()  # as the engine process does, before CuPy makes its cuBLAS handle

REQUESTS = 96  # a step of two forwards: 64 rows (MAX_BATCH) and the rest
PARAMS = ({"temperature": 0.7, "top_k": 40}, {"temperature": 0.9, "top_p": 0.9}, {"temperature": 1.0, "min_p": 0.05},
          {"temperature": 0.0}, {"temperature": 0.8, "top_k": 40, "logprobs": 2}, {"temperature": 0.0, "logprobs": 1})


def runner_for(path: str, blocks: int, device: str):
    from engine.model.weights import load_model
    from engine.ops.backend import cpu_backend, gpu_backend
    from engine.runner.runner import ModelRunner

    backend = gpu_backend() if device == "gpu" else cpu_backend()
    cfg, weights, _ = load_model(path, backend, keep_blocks=True)
    runner = ModelRunner(cfg, weights, backend, 2048, 256, frozenset(), max_running=REQUESTS, blocks=blocks,
                         block_size=16)
    runner.warm_up()
    return runner


def gens(vocab: int) -> list[m.Gen]:
    """REQUESTS requests: 20-60-token prompts, 24-72 tokens each, their parameters in turn from PARAMS, seeded."""
    rng = np.random.default_rng(3)
    out = []
    for i in range(REQUESTS):
        prompt = tuple(int(t) for t in rng.integers(100, vocab - 100, int(rng.integers(20, 60))))
        out.append(m.Gen(24 + (i * 7) % 49, prompt, PARAMS[i % len(PARAMS)] | {"seed": 1000 + i}, i + 1))
    return out


def serve(runner, runs_async: bool, only: int | None = None) -> tuple[dict[int, list], int, bool]:
    """Each request's lines (tokens with their log-probabilities, DONE last), the tokens drawn behind a forward,
    and whether a request paused; `only`: that request alone."""
    from engine.loop.loop import EngineLoop
    from engine.loop.park_policy import ParkPolicy
    from engine.runner.picks import DrawsBehind

    runner.runs_async = runs_async
    out: list = []
    behind = [0]
    collect = DrawsBehind.collect

    def counted(self) -> None:
        collect(self)
        behind[0] += sum(seq.picked is not None for seq, _ in self.rows)
    DrawsBehind.collect = counted
    try:
        loop = EngineLoop(runner, ParkPolicy(), out.append)
        waiting = {gen.id: gen for gen in gens(runner.cfg.vocab_size) if only in (None, gen.id)}
        for gen in waiting.values():
            loop.control(gen)
        seen = 0
        while loop.busy or not loop.inbox.empty() or seen < len(out):
            loop.take_lines(block=False)
            loop.round()
            fresh, seen = out[seen:], len(out)
            for x in fresh:  # a GEN deferred for memory is sent again, as the server does
                if isinstance(x, m.Defer):
                    loop.control(waiting[x.id])
    finally:
        DrawsBehind.collect = collect
    lines: dict[int, list] = {}
    for x in out:
        if isinstance(x, m.Token):
            lines.setdefault(x.id, []).append((x.token, x.logprob, x.top))
        elif isinstance(x, (m.Done, m.Err)):
            lines.setdefault(x.id, []).append(type(x).__name__)
    assert not any(isinstance(x, m.Err) for x in out), [x for x in out if isinstance(x, m.Err)][:3]
    paused = any(isinstance(x, m.Info) and x.fields.get("paused") == "1" for x in out)
    return lines, behind[0], paused


def check(path: str, blocks: int, device: str) -> dict:
    runner = runner_for(path, blocks, device)
    before, _, paused_before = serve(runner, runs_async=False)
    during, drawn_behind, paused = serve(runner, runs_async=True)
    same = [ident for ident in before if before[ident] == during.get(ident)]
    ended = all(lines[-1] == "Done" for lines in during.values()) and len(during) == REQUESTS
    alone = [ident for ident in range(1, REQUESTS + 1, 8) if serve(runner, True, ident)[0][ident] == during[ident]]
    out = {"model": Path(path).name, "blocks": blocks, "requests_same": len(same), "requests": len(before),
           "alone_same": len(alone), "alone": len(range(1, REQUESTS + 1, 8)),
           "tokens": sum(len(lines) - 1 for lines in during.values()), "drawn_behind": drawn_behind,
           "paused": paused, "paused_before": paused_before, "all_done": ended}
    out["ok"] = bool(len(same) == REQUESTS and len(during) == REQUESTS and ended and drawn_behind > 0
                     and out["alone_same"] == out["alone"])
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model")
    p.add_argument("--json")
    p.add_argument("--device", choices=("gpu", "cpu"), default="gpu",
                   help="cpu: the same loop without draws behind (a dry run of the check: it fails there)")
    p.add_argument("--blocks", default="1024,240", help="the KV pools, in blocks of 16 positions: room for every "
                   "request's rows (96 x at most 132 positions), then too little (requests paused)")
    a = p.parse_args()
    pools = [int(b) for b in a.blocks.split(",")]
    return report((({"blocks": blocks}, partial(check, a.model, blocks, a.device)) for blocks in pools),
                  "DRAWS BEHIND CHECK", a.json)


if __name__ == "__main__":
    sys.exit(main())
