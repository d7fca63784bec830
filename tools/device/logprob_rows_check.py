"""A step's log-probabilities on the GPU (engine/runner/logprob_rows.py, argmax.cu's row_logprobs) against the host
sampler's (Sampler.logprobs, fp64 over the row copied back): every row's token log-probability within 1e-9 and its
top 5 tokens the same, a row's figures the same bits scored alone as among 64, and the time of 64 rows each way
(medians of 9, CUDA-synchronized) over a 128,256-token vocabulary (Llama 3's).

    python tools/device/logprob_rows_check.py [--rows 64] [--vocab 128256] [--json FILE]

Exit status 0 when every check passes.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def main() -> int:
    import cupy as cp

    from engine.kernels import GpuKernels
    from engine.runner.logprob_rows import LogprobRows
    from engine.runner.sampler import Sampler, SamplingParams
    from engine.runner.sequence import Sequence

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=64)
    p.add_argument("--vocab", type=int, default=128256)
    p.add_argument("--json")
    a = p.parse_args()
    rng = np.random.default_rng(5)
    host = (rng.standard_normal((a.rows, a.vocab)) * 2).astype(np.float32)
    host[:, rng.choice(a.vocab, 30, replace=False)] += 9
    step = cp.asarray(host)  # (rows, vocab): a decode step's output

    class Decoder:
        logits = step

        @staticmethod
        def greedy_token(row: int) -> int:
            return int(host[row].argmax())

    rows = LogprobRows(cp, GpuKernels(cp), Decoder)
    prompt = (1, 2, 3)

    def seqs(top: int = 5) -> list:
        out = []
        for i in range(a.rows):
            seq = Sequence(id=i, prompt=prompt, max_new=8, sampler=Sampler(SamplingParams(), prompt),
                           stop_ids=frozenset(), logprobs=top)
            seq.logits, seq.graph_row = step[i], i
            out.append(seq)
        return out

    def batched() -> list:
        batch = seqs()
        rows.ahead(batch)
        return [rows.logprobs(seq, Decoder.greedy_token(seq.graph_row)) for seq in batch]

    def on_host() -> list:
        return [seq.sampler.logprobs(seq.logits, Decoder.greedy_token(seq.graph_row), seq.logprobs) for seq in seqs()]

    together, reference = batched(), on_host()
    alone = [rows.logprobs(seq, Decoder.greedy_token(i)) for i, seq in enumerate(seqs())]  # each a batch of one
    worst = max(abs(g[0] - r[0]) for g, r in zip(together, reference))
    checks = {"same_bits_alone_and_among_rows": together == alone,
              "token_logprob_within_1e-9": worst <= 1e-9,
              "top_tokens_the_hosts": all([t for t, _ in g[1]] == [t for t, _ in r[1]]
                                          for g, r in zip(together, reference))}

    def ms(fn) -> float:
        times = []
        for _ in range(9):
            cp.cuda.runtime.deviceSynchronize()
            began = time.perf_counter()
            fn()
            cp.cuda.runtime.deviceSynchronize()
            times.append((time.perf_counter() - began) * 1000)
        return round(statistics.median(times), 3)

    def ahead_then_each() -> None:  # the token's figure alone, as a client asking logprobs=true gets it
        batch = seqs(top=0)
        rows.ahead(batch)
        for seq in batch:
            rows.logprobs(seq, Decoder.greedy_token(seq.graph_row))

    timing = {"rows": a.rows, "vocab": a.vocab, "largest_difference": worst, "batched_ms": ms(ahead_then_each),
              "host_ms": ms(lambda: [s.sampler.logprobs(s.logits, 0, 0) for s in seqs(top=0)])}
    result = {"checks": checks, "timing": timing, "device": cp.cuda.runtime.getDeviceProperties(0)["name"].decode()}
    print(json.dumps(result, indent=1))
    if a.json:
        Path(a.json).write_text(json.dumps(result, indent=1))
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
