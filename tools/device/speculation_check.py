"""Speculative decoding on the GPU (issue 47): a request's drafts (n-grams, or a draft model's with --draft) go
through the decode graph as rows after its newest token's, and its tokens must be those of one-token steps. On the
engine process (`--speculative ngram`, or `draft`), for each model given:

- greedy, alone: the same tokens and state fingerprint with drafts (spec 1) as without (spec 0), drafts
  counted and some accepted (a greedy answer of a random model falls into a loop the drafts then follow;
  a trained one copies);
- greedy, four requests together, two with drafts and two without: each its tokens alone;
- seeded temperature draws: the same tokens with and without drafts (each row drawn with the request's
  next uniform, as a one-token step draws it);
- decode speed with and without drafts on the looping answer (tokens a second, the drafts' share).

Drafted rows are taken as free (`--draft-row-cost 0`): every draft is made at full length, whatever it would
bring, so that the checks verify many; `--row-cost measured` runs the default pace (what the decode steps measure).

    python tools/device/speculation_check.py MODEL [MODEL...] [--max-new 200] [--device gpu] [--draft FILE|self]
        [--json OUT]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from protocol import messages as m  # noqa: E402
from protocol.pipe_client import EnginePipe  # noqa: E402
from tools.checks import preempt_scenarios as sc  # noqa: E402

GREEDY = {"temperature": 0.0, "seed": 0}  # (a seed: the state fingerprint holds the RNG)
SEEDED = {"temperature": 0.8, "top_p": 0.95, "seed": 5}


def prompt_tokens(vocab: int) -> tuple[int, ...]:
    """A prompt that repeats itself (a passage quoted twice), in any vocabulary: drafts have something to follow."""
    piece = [(17 * i + 3) % (vocab - 200) + 100 for i in range(48)]
    return tuple([1] + piece + piece[:24])


def run(engine: EnginePipe, ident: int, prompt, params: dict, spec: int, max_new: int) -> tuple[list[m.Message], float]:
    started = time.perf_counter()
    engine.send(m.Gen(max_new, tuple(prompt), {**params, "fp": 1, "reuse": 0, "spec": spec}, ident))
    lines = engine.read_until(m.Done, ident=ident)
    return lines, time.perf_counter() - started


def check(model: str, max_new: int, device: str, draft: str | None = None, row_cost: str = "0",
          drafts_optional: bool = False) -> dict:
    """The checks on one model, its drafts n-grams, or a draft model's (draft: a GGUF of its vocabulary, or "self").
    Some drafts must have been made, unless drafts_optional (a model whose text never repeats: only the exactness
    and what speculating costs when nothing is drafted)."""
    drafter = ["ngram"] if draft is None else ["draft", "--draft", model if draft == "self" else draft]
    pace = [] if row_cost == "measured" else ["--draft-row-cost", row_cost]
    engine = EnginePipe([sys.executable, "-m", "engine", "--serve", "--model", model, "--device", device,
                         "--speculative", *drafter, "--draft-max", "8", *pace], cwd=ROOT)
    engine.handshake()
    prompt = prompt_tokens(int(engine.info.get("vocab", 32000)))
    out, ident = {"model": Path(model).name, "drafter": drafter[-1]}, iter(range(1, 1000))
    try:
        plain, plain_s = run(engine, next(ident), prompt, GREEDY, 0, max_new)
        drafted, drafted_s = run(engine, next(ident), prompt, GREEDY, 1, max_new)
        a, b = plain[-1].id, drafted[-1].id
        out["greedy_same_tokens"] = sc.tokens_of(drafted, b) == sc.tokens_of(plain, a)
        out["greedy_same_state"] = drafted[-1].extra.get("fp") == plain[-1].extra.get("fp")
        out["drafted"], out["accepted"] = int(drafted[-1].extra.get("drafted", 0)), int(drafted[-1].extra.get("accepted", 0))
        out["decode_s_without"], out["decode_s_with"] = round(plain_s, 3), round(drafted_s, 3)
        out["speedup"] = round(plain_s / drafted_s, 2)
        # four together, two drafting
        ids = [next(ident) for _ in range(4)]
        for i, rid in enumerate(ids):
            engine.send(m.Gen(max_new, prompt[: 40 + 8 * i], {**GREEDY, "reuse": 0, "spec": i % 2}, rid))
        seen, done = [], set()
        while len(done) < 4:
            line = engine.read()
            seen.append(line)
            if isinstance(line, m.Done):
                done.add(line.id)
        alone = []
        for i in range(4):
            lines, _ = run(engine, next(ident), prompt[: 40 + 8 * i], GREEDY, 0, max_new)
            alone.append(sc.tokens_of(lines, lines[-1].id))
        out["together_same_tokens"] = all(sc.tokens_of(seen, rid) == alone[i] for i, rid in enumerate(ids))
        s0, _ = run(engine, next(ident), prompt, SEEDED, 0, max_new)
        s1, _ = run(engine, next(ident), prompt, SEEDED, 1, max_new)
        out["seeded_same_tokens"] = sc.tokens_of(s1, s1[-1].id) == sc.tokens_of(s0, s0[-1].id)
        out["seeded_accepted"] = int(s1[-1].extra.get("accepted", 0))
    finally:
        engine.close()
    out["ok"] = all(out[k] for k in ("greedy_same_tokens", "greedy_same_state", "together_same_tokens",
                                    "seeded_same_tokens")) and (out["drafted"] > 0 or drafts_optional)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("models", nargs="+")
    p.add_argument("--max-new", type=int, default=200)
    p.add_argument("--device", default="gpu", help="gpu (what this checks), or cpu to try the script")
    p.add_argument("--draft", help="a draft model instead of n-grams (--speculative draft): a GGUF of the models' "
                                   "vocabulary, or self (each model drafting for itself)")
    p.add_argument("--row-cost", default="0", help="--draft-row-cost for the engine, or `measured` (the default pace)")
    p.add_argument("--drafts-optional", nargs="*", default=[], metavar="MODEL",
                   help="these of the models pass without drafts (random weights whose text never repeats)")
    p.add_argument("--json")
    a = p.parse_args()
    report = [check(model, a.max_new, a.device, a.draft, a.row_cost, model in a.drafts_optional) for model in a.models]
    for r in report:
        print(json.dumps(r), flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(report, indent=1) + "\n")
    return 0 if all(r["ok"] for r in report) else 1


if __name__ == "__main__":
    sys.exit(main())
