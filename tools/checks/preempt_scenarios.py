"""Park/resume parity scenarios, driven over an engine's pipes (`strata --serve --prefill-preempt`).

Each scenario returns what request A produced: its tokens and its state fingerprints. Parity means
the tokens and the DONE fingerprint equal those of the uninterrupted run.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from protocol import messages as m
from protocol.pipe_client import EnginePipe

A, B = 1, 2


@dataclass
class Outcome:
    tokens: list[int]
    done_fp: str
    parks: list[int] = field(default_factory=list)  # positions A parked at
    park_fps: list[str] = field(default_factory=list)
    resume_fps: list[str] = field(default_factory=list)
    finish: str = ""
    done: m.Done | None = None  # the DONE line (its prompt_ms and decode_ms)


def tokens_of(lines: list[m.Message], ident: int) -> list[int]:
    return [x.token for x in lines if isinstance(x, m.Token) and x.id == ident]


def gen(prompt, max_new: int, params: dict, ident: int) -> m.Gen:
    """Every scenario reads its prompt from position 0 (no reuse of a slot's kept conversation), so
    that the parked and the uninterrupted reads run the same chunks."""
    return m.Gen(max_new, tuple(prompt), {**params, "fp": 1, "reuse": 0}, ident)


def finish_a(engine: EnginePipe, seen: list[m.Message], outcome: Outcome) -> Outcome:
    seen += engine.read_until(m.Done, ident=A)
    outcome.tokens = tokens_of(seen, A)
    outcome.done_fp, outcome.finish, outcome.done = seen[-1].extra["fp"], seen[-1].finish, seen[-1]
    return outcome


def uninterrupted(engine: EnginePipe, prompt, max_new: int, params: dict) -> Outcome:
    engine.send(gen(prompt, max_new, params, A))
    return finish_a(engine, [], Outcome([], ""))


def read_to_boundary_and_park(engine: EnginePipe, chunk: int, boundary: int, seen: list[m.Message],
                              outcome: Outcome, offered: bool = False) -> None:
    """Offer a park so that A parks at position boundary*chunk (the offer is sent while the chunk
    ending there is being read; offered: it went with A's RESUME already), then record the park."""
    target = boundary * chunk
    while not offered:
        done = max([x.done for x in seen if isinstance(x, m.PromptProgress) and x.id == A] +
                   [x.pos for x in seen if isinstance(x, m.Fingerprint) and x.id == A] or [0])
        if done >= target - chunk:
            engine.send(m.Yield())
            break
        seen.append(engine.read())
        if isinstance(seen[-1], (m.Err, m.Done)):
            raise AssertionError(f"A ended before reaching boundary {boundary}: {seen[-1]}")
    got = engine.read_until(m.Suspended, ident=A)
    seen += got
    suspended = got[-1]
    if suspended.done != target:
        engine.send(m.Cancel(A))
        engine.read_until(m.Done, ident=A)
        raise AssertionError(f"parked at {suspended.done}, wanted {target}: {got}")
    outcome.parks.append(suspended.done)
    outcome.park_fps.append(next(x.digest for x in got if isinstance(x, m.Fingerprint) and x.stage == "park"))


def run_interim(engine: EnginePipe, prompt, decode_tokens: int, params: dict) -> list[int]:
    """Request B while A is parked. decode_tokens=0: B is stopped after its first prompt chunk."""
    engine.send(gen(prompt, max(decode_tokens, 1), params, B))
    if decode_tokens == 0:
        engine.read_until(m.PromptProgress, ident=B)
        engine.send(m.Stop(B))
    return tokens_of(engine.read_until(m.Done, ident=B), B)


def resume(engine: EnginePipe, seen: list[m.Message], outcome: Outcome, then_yield: bool = False) -> None:
    """A resumed; then_yield: with the offer of its next park sent in the same breath, so that it parks at
    the end of the chunk it reads next (sent after the resume's fingerprint came back, a loaded machine could
    let the engine read past that chunk, and past the prompt's end, before the offer arrived)."""
    engine.send(m.Resume(A), *([m.Yield()] if then_yield else []))
    got = engine.read_until(m.Fingerprint, ident=A)
    seen += got
    outcome.resume_fps.append(got[-1].digest)


def parked(engine: EnginePipe, prompt, max_new: int, params: dict, chunk: int, boundaries: list[int],
           interim_prompt=None, interim_tokens: int | None = None) -> Outcome:
    """A parks at each of `boundaries` (in chunks); between park and resume an interim request B
    runs if interim_tokens is not None; otherwise it is a pure restore."""
    outcome, seen = Outcome([], ""), []
    # a park at the first chunk's end: its offer goes in the GEN's write (sent after it, a loaded machine could let
    # the engine read that chunk first)
    offered = boundaries[0] == 1
    engine.send(gen(prompt, max_new, params, A), *([m.Yield()] if offered else []))
    for boundary, following in zip(boundaries, [*boundaries[1:], None]):
        read_to_boundary_and_park(engine, chunk, boundary, seen, outcome, offered)
        if interim_tokens is not None:
            run_interim(engine, interim_prompt, interim_tokens, params)
        offered = following == boundary + 1  # the next park is at the end of the very next chunk
        resume(engine, seen, outcome, then_yield=offered)
    return finish_a(engine, seen, outcome)


def cancel_while_parked(engine: EnginePipe, prompt, params: dict, chunk: int) -> m.Done:
    outcome, seen = Outcome([], ""), []
    engine.send(gen(prompt, 4, params, A), m.Yield())  # (one write: parked at its first chunk's end)
    read_to_boundary_and_park(engine, chunk, 1, seen, outcome, offered=True)
    engine.send(m.Cancel(A))
    return engine.read_until(m.Done, ident=A)[-1]


def yield_during_decode(engine: EnginePipe, prompt, max_new: int, params: dict) -> tuple[Outcome, list]:
    """A YIELD offered after the first token must be ignored: decode never parks."""
    engine.send(gen(prompt, max_new, params, A))
    seen = engine.read_until(m.Token, ident=A)
    engine.send(m.Yield())
    outcome = finish_a(engine, seen, Outcome([], ""))
    return outcome, [x for x in seen if isinstance(x, (m.Suspended, m.Decline))]


def read_beside_decoders(engine: EnginePipe, prompt, max_new: int, params: dict, interim,
                         decoders: int, decode_tokens: int) -> tuple[Outcome, dict[int, list[int]], int]:
    """A reads while `decoders` requests decode in the other slots (the engine started with a small
    --decode-interval-ms, so A's chunks pause between layers for their steps). Returns A's outcome,
    the decoders' tokens (by id, from 10 up) and how many decoder tokens came inside A's first chunk."""
    idents = [10 + i for i in range(decoders)]
    seen: list[m.Message] = []
    for i, ident in enumerate(idents):
        engine.send(gen(interim, decode_tokens, {**params, "seed": 100 + i}, ident))
    for ident in idents:
        seen += engine.read_until(m.Token, ident=ident)
    engine.send(gen(prompt, max_new, params, A))
    outcome = finish_a(engine, seen, Outcome([], ""))
    for ident in idents:
        if not any(isinstance(x, m.Done) and x.id == ident for x in seen):
            seen += engine.read_until(m.Done, ident=ident)
    start = next(i for i, x in enumerate(seen) if isinstance(x, m.Info) and x.id == A)
    first_pp = next(i for i, x in enumerate(seen) if isinstance(x, m.PromptProgress) and x.id == A)
    inside = sum(isinstance(x, m.Token) and x.id in idents for x in seen[start:first_pp])
    return outcome, {ident: tokens_of(seen, ident) for ident in idents}, inside


def decoders_alone(engine: EnginePipe, params: dict, interim, decoders: int, decode_tokens: int) -> dict[int, list[int]]:
    """The decoders of read_beside_decoders, each run alone."""
    out = {}
    for i in range(decoders):
        engine.send(gen(interim, decode_tokens, {**params, "seed": 100 + i}, 10 + i))
        out[10 + i] = tokens_of(engine.read_until(m.Done, ident=10 + i), 10 + i)
    return out
