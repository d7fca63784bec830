"""The KV pool's guarantees on a real engine, CPU or GPU, through its pipes:

1. a prompt whose start another request read (finished, still decoding, parked, or evicted from the
   pool and kept in the host tier, --cache-ram) reuses those blocks and gives the same greedy tokens
   and the same state fingerprint as a cold read of it;
2. requests decoding together (a batch as large as the running set) give their solo tokens;
3. a pool too small for everyone at once (--kv-tokens) defers, moves out and pauses, and every
   request still gives its solo tokens.

    python tools/checks/paged_check.py [--model PATH] [--device cpu|gpu] [--chunk 256] [--json out.json]

Exit 1 if any check fails. tests/engine/kvcache/test_kv_pool_real.py runs it on the CPU with small sizes.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from protocol import messages as m  # noqa: E402
from protocol.pipe_client import EnginePipe  # noqa: E402


def engine(a: argparse.Namespace, *extra: str) -> EnginePipe:
    cmd = [*a.wrap.split(), sys.executable, "-m", "engine", "--serve", "--device", a.device, "--chunk", str(a.chunk),
           "--prefill-preempt-min-tokens", "0", *extra, *a.engine_args.split()] + (["--model", a.model] if a.model else [])
    pipe = EnginePipe(cmd, cwd=ROOT)
    STARTED.append(pipe)
    pipe.handshake()
    return pipe


STARTED: list[EnginePipe] = []  # for the engines' own words when a check fails


def prompt(seed: int, n: int, vocab: int, head: tuple[int, ...] = ()) -> tuple[int, ...]:
    rng = np.random.default_rng(seed)
    return head + tuple(int(t) for t in rng.integers(100, min(vocab, 30000), n - len(head)))


def answer(e: EnginePipe, ident: int) -> tuple[list[int], m.Done, dict]:
    """Lines up to ident's DONE: its tokens, the DONE, and its INFO fields."""
    tokens, info = [], {}
    while True:
        msg = e.read()
        if isinstance(msg, m.Err) and msg.id == ident:
            raise RuntimeError(f"request {ident}: {msg.message}")
        if msg.id != ident:
            continue
        if isinstance(msg, m.Info):
            info |= msg.fields
        elif isinstance(msg, m.Token):
            tokens.append(msg.token)
        elif isinstance(msg, m.Done):
            return tokens, msg, info


def run_all(e: EnginePipe, gens: list[m.Gen]) -> dict[int, tuple[list[int], m.Done]]:
    for g in gens:
        e.send(g)
    out, tokens = {}, {g.id: [] for g in gens}
    while len(out) < len(gens):
        msg = e.read()
        if isinstance(msg, m.Err):
            raise RuntimeError(f"request {msg.id}: {msg.message}")
        if isinstance(msg, m.Defer):
            raise RuntimeError(f"request {msg.id} deferred ({msg.reason}) by an engine with room")
        if isinstance(msg, m.Token):
            tokens[msg.id].append(msg.token)
        elif isinstance(msg, m.Done):
            out[msg.id] = (tokens[msg.id], msg)
    return out


def warm_and_cold(e: EnginePipe, a, prompt_tokens, params: dict, ident: int) -> tuple[bool, dict]:
    """The prompt with the prefix cache (id ident), then read cold (ident + 1): whether their tokens
    and state fingerprints are equal, and the warm one's INFO fields (cached, from_host)."""
    e.send(m.Gen(a.max_new, prompt_tokens, params, ident))
    warm, warm_done, info = answer(e, ident)
    e.send(m.Gen(a.max_new, prompt_tokens, params | {"reuse": 0}, ident + 1))
    cold, cold_done, _ = answer(e, ident + 1)
    return warm == cold and warm_done.extra["fp"] == cold_done.extra["fp"], info


def check_reuse(a, report: list, roomy) -> None:
    e = roomy()
    vocab, c = int(e.info["vocab"]), a.chunk
    shared = prompt(1, 3 * c + c // 2, vocab)  # the agent's system prompt: 3.5 chunks
    params = {"fp": 1, "seed": 7}
    # finished: A reads the shared start, then B = shared + its own tail reuses its whole blocks (where rows
    # do not depend on the step: the engine's INFO shape_free) or its whole chunks: 3.5 or 3 chunks
    unit = int(e.info["kv_block"]) if e.info.get("shape_free") == "1" else c
    e.send(m.Gen(a.max_new, shared + prompt(2, c // 3, vocab), params, 1))
    answer(e, 1)
    same, info = warm_and_cold(e, a, prompt(3, 4 * c + 5, vocab, shared), params, 2)
    report.append({"check": "reuse from a finished request", "cached": int(info.get("cached", 0)),
                   "ok": same and int(info["cached"]) == len(shared) // unit * unit})
    # running: D decodes a long answer while E shares its prompt's whole chunks. E reads beside D's
    # decode steps and takes one token, so that its fingerprint holds its prompt's rows only (decode
    # rows of a batch need not be bit-equal to a lone step's on the CPU: BLAS is not batch-invariant)
    d_prompt = prompt(4, 2 * c + 7, vocab)
    e.send(m.Gen(8 * a.max_new, d_prompt, params, 4))
    while not isinstance(msg := e.read(), m.Token) or msg.id != 4:
        pass
    e_prompt = prompt(5, 3 * c + 1, vocab, d_prompt)
    e.send(m.Gen(1, e_prompt, params, 5))
    got, tokens_e = {}, []
    while 4 not in got or 5 not in got:  # E and D finish in either order; D is cancelled once E is done
        msg = e.read()
        if isinstance(msg, m.Info) and msg.id == 5 and "cached" in msg.fields:
            got["cached"] = int(msg.fields["cached"])
        elif isinstance(msg, m.Token) and msg.id == 5:
            tokens_e.append(msg.token)
        elif isinstance(msg, m.Done) and msg.id in (4, 5):
            got[msg.id] = msg
            if msg.id == 5 and 4 not in got:
                e.send(m.Stop(4))  # its decode steps beside E's read were the point
    e.send(m.Gen(1, e_prompt, params | {"reuse": 0}, 6))
    cold, cold_done, _ = answer(e, 6)
    report.append({"check": "reuse from a request still decoding", "cached": got["cached"],
                   "ok": tokens_e == cold and got[5].extra["fp"] == cold_done.extra["fp"] and got["cached"] == 2 * c})
    # parked: F's long read is asked to yield at once, and parks at a chunk boundary (its first, or
    # a later one); G shares F's first chunk
    f_prompt = prompt(6, 12 * c + 3, vocab)
    e.send(m.Gen(1, f_prompt, params, 7))
    e.send(m.Yield(7))
    while not isinstance(msg := e.read(), (m.Suspended, m.Decline, m.Done)) or msg.id != 7:
        pass
    if not isinstance(msg, m.Suspended):
        raise RuntimeError(f"F did not park: {msg}")
    same, info = warm_and_cold(e, a, prompt(8, c + c // 2, vocab, f_prompt[:c]), params, 8)
    e.send(m.Cancel(7))
    answer(e, 7)
    report.append({"check": "reuse from a parked read", "cached": int(info.get("cached", 0)),
                   "ok": same and int(info["cached"]) == c})


def check_host_tier(a, report: list, roomy) -> None:
    """A pool of six chunks with a host tier: H's cached chunks are evicted by a request that needs
    the whole pool, copied to host memory, and copied back when H's prompt comes again."""
    c = a.chunk
    e = engine(a, "--kv-tokens", str(6 * c), "--ctx", str(6 * c), "--kv-block", str(c), "--cache-ram", "0.25")
    vocab, params = int(e.info["vocab"]), {"fp": 1, "seed": 7}
    shared = prompt(11, 3 * c + c // 2, vocab)
    e.send(m.Gen(a.max_new, shared, params, 1))
    answer(e, 1)
    filler = prompt(12, 6 * c - a.max_new - 1, vocab)  # every block of the pool: H's are evicted
    e.send(m.Gen(a.max_new, filler, params | {"reuse": 0}, 2))
    answer(e, 2)
    same, info = warm_and_cold(e, a, prompt(13, 4 * c + 5, vocab, shared), params, 3)
    report.append({"check": "reuse from the host tier after eviction", "cached": int(info.get("cached", 0)),
                   "from_host": int(info.get("from_host", 0)),
                   "ok": same and int(info.get("from_host", 0)) == int(info.get("cached", 0)) == 3 * c})
    e.close()


def check_batch_and_pressure(a, report: list, roomy) -> None:
    solo = {}
    e = roomy()
    vocab = int(e.info["vocab"])
    gens = [m.Gen(a.max_new, prompt(100 + i, a.chunk // 2 + 37 * i, vocab), {"seed": 1}, 10 + i) for i in range(a.batch)]
    for g in gens:
        solo[g.id] = run_all(e, [g])[g.id][0]
    together = run_all(e, gens)
    report.append({"check": f"{a.batch} requests decoding together equal their solo runs",
                   "ok": all(together[g.id][0] == solo[g.id] for g in gens)})
    # a pool of one request's worth: the others are deferred (the check sends them again once one has
    # ended), and those in flight pause each other when their answers grow
    need = -(-(max(len(g.tokens) for g in gens) + a.max_new) // a.chunk) * a.chunk  # one request's worth
    small = engine(a, "--kv-tokens", str(need), "--ctx", str(need), "--no-prompt-reuse")
    out, tokens, retry, deferred, paused = {}, {g.id: [] for g in gens}, [], 0, 0
    for g in gens:
        small.send(g)
    while len(out) < len(gens):
        msg = small.read()
        if isinstance(msg, m.Err):
            raise RuntimeError(f"request {msg.id}: {msg.message}")
        if isinstance(msg, m.Defer):  # kept, and sent again once a request has ended (as the server does)
            deferred += 1
            retry.append(next(g for g in gens if g.id == msg.id))
        elif isinstance(msg, m.Info) and msg.fields.get("paused") == "1":
            paused += 1
        elif isinstance(msg, m.Token):
            tokens[msg.id].append(msg.token)
        elif isinstance(msg, m.Done):
            out[msg.id] = msg
            for g in retry:
                small.send(g)
            retry.clear()
    equal = [g.id for g in gens if tokens[g.id] == solo[g.id]]
    report.append({"check": "a small pool defers and pauses, and every answer equals its solo run",
                   "deferred": deferred, "paused": paused, "answers_equal": len(equal), "answers": len(gens),
                   "ok": deferred + paused > 0 and len(equal) == len(gens)})
    small.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model")
    p.add_argument("--device", default="auto")
    p.add_argument("--chunk", type=int, default=256)
    p.add_argument("--max-new", type=int, default=16)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--only", nargs="+", choices=("reuse", "host", "pressure"), help="run these groups of checks")
    p.add_argument("--engine-args", default="", help="more engine flags (e.g. --no-cuda-graphs)")
    p.add_argument("--wrap", default="", help="a command to run the engine under (e.g. compute-sanitizer)")
    p.add_argument("--json")
    a = p.parse_args(argv)
    report: list[dict] = []
    checks = {"reuse": check_reuse, "host": check_host_tier, "pressure": check_batch_and_pressure}
    shared: list[EnginePipe] = []

    def roomy() -> EnginePipe:
        """The engine the reuse and batch checks share, started once: room for everyone (and for a
        sanitizer's own memory)."""
        if not shared:
            shared.append(engine(a, "--kv-tokens", "32768"))
        return shared[0]

    for check in [checks[name] for name in a.only] if a.only else checks.values():
        done = len(report)
        try:
            check(a, report, roomy)
        except (EOFError, RuntimeError) as e:  # the engine died or refused: its own words, whole
            said = [line for pipe in STARTED for line in pipe.stderr if line.startswith("strata:")]
            report.append({"check": check.__name__, "ok": False, "error": str(e)[-6000:], "engine_said": said[-40:]})
            for pipe in shared:  # a later check starts its own
                pipe.close()
            shared.clear()
        for row in report[done:]:
            print(("ok   " if row["ok"] else "FAIL ") + json.dumps(row), flush=True)
    for e in shared:
        e.close()
    if a.json:
        Path(a.json).write_text(json.dumps(report, indent=1))
    return 0 if all(r["ok"] for r in report) else 1


if __name__ == "__main__":
    sys.exit(main())
