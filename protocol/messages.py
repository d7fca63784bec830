"""One frozen dataclass per line type of the engine protocol.

Server -> engine: Gen, Stop, Yield, Resume, Cancel, Quit.
Engine -> server: Info, Ready, PromptProgress (PP on the wire), Token (T), Embedding (EMB),
PromptLogprobs (PLP), Suspended, Decline,
Defer, Fingerprint (FP), Done, Err.
`id` is None for a line without the ` id=N` suffix.
"""
from __future__ import annotations

from dataclasses import dataclass, field

# The engine's exit status when it refuses its model or options at start-up (an ERR line before READY says
# why: a file it cannot read, a --ctx or --max-running that does not fit): starting it again would not help.
START_REFUSED = 3
# Its exit status when the device ran out of memory in a step: an INFO out_of_memory_running=N before it says how
# many requests were in the engine, and the server starts it again with --max-running below that (nothing is lost:
# the requests continue on the new engine, as after any death).
OUT_OF_MEMORY = 4
OUT_OF_MEMORY_RUNNING = "out_of_memory_running"

# GEN keys and their value types: the one list of what a GEN may carry.
GEN_KEYS: dict[str, type] = {
    "temperature": float,
    "top_p": float,
    "top_k": int,
    "min_p": float,
    "seed": int,
    "repeat_penalty": float,
    "repeat_last_n": int,
    "presence_penalty": float,
    "frequency_penalty": float,
    "stop": tuple,  # extra stop token ids, comma-separated on the wire
    "fp": int,  # 1 = print state fingerprints at park, resume and DONE
    "drawn": int,  # tokens this request already generated before an engine restart (they end the prompt): they
    # go through as decode rows, not written again, and their random draws are skipped, so the state and a seeded
    # stream go on unchanged; DONE counts the tokens after them
    "grammar": str,  # the output must match this grammar (llguidance's grammar text, escaped)
    "reuse": int,  # 0 = read the whole prompt even if a slot kept its start (default 1: reuse it)
    "session": str,  # the client's session (a prompt_cache_key): its cached prefix outlives one-off requests'
    "spec": int,  # 0 = no speculative decoding for this request (default 1: as the engine's --speculative says)
    "logprobs": int,  # N in 0..20: each T carries its token's log-probability and the N likeliest tokens'
    "prompt_logprobs": int,  # N in 0..20: PLP lines give each prompt token's log-probability (and the N likeliest)
    "embed": int,  # 1 = an embedding: the prompt is read, then an EMB line carries its pooled hidden state (no
    # token is drawn) and DONE follows with generated=0
}
MAX_TOP_LOGPROBS = 20

FINISH_REASONS = ("stop", "length", "cancel")
FINGERPRINT_STAGES = ("park", "resume", "done")


@dataclass(frozen=True)
class Gen:
    max_new: int
    tokens: tuple[int, ...]
    params: dict = field(default_factory=dict)
    id: int | None = None


@dataclass(frozen=True)
class Stop:
    id: int | None = None


@dataclass(frozen=True)
class Yield:
    id: int | None = None


@dataclass(frozen=True)
class Resume:
    id: int


@dataclass(frozen=True)
class Cancel:
    id: int


@dataclass(frozen=True)
class Quit:
    id: int | None = None


@dataclass(frozen=True)
class Info:
    fields: dict[str, str]
    id: int | None = None


@dataclass(frozen=True)
class Ready:
    ctx: int
    caps: tuple[str, ...] = ()
    id: int | None = None


@dataclass(frozen=True)
class PromptProgress:
    """PP: a chunk of the prompt read, `done` of `total` tokens, the chunk's time and rate."""

    done: int
    total: int
    ms: float
    tok_s: float
    id: int | None = None


@dataclass(frozen=True)
class Token:
    """T: one generated token; with GEN logprobs=N, its log-probability under the logits it was drawn
    from (`logprob`, lp= on the wire) and the N likeliest tokens' ids and log-probabilities (`top`,
    top=id:lp,id:lp, likeliest first)."""

    token: int
    id: int | None = None
    logprob: float | None = None
    top: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True)
class Embedding:
    """EMB: an embed request's pooled hidden state (after the final norm, pooled as the engine's INFO
    pooling= says; not normalized), float32 values; on the wire little-endian float32, base64."""

    vector: tuple[float, ...]
    id: int | None = None


@dataclass(frozen=True)
class PromptLogprobs:
    """PLP: the log-probabilities of prompt tokens start, start+1, ... (each under the logits of the row
    before it: the first prompt token has none), and with GEN prompt_logprobs=N the N likeliest tokens'
    at each (`top`, on the wire top=id:lp,id:lp;id:lp,... a position's list after another's)."""

    start: int
    logprobs: tuple[float, ...]
    top: tuple[tuple[tuple[int, float], ...], ...] = ()
    id: int | None = None


@dataclass(frozen=True)
class Suspended:
    done: int
    total: int
    id: int | None = None


@dataclass(frozen=True)
class Decline:
    """A boundary offer (YIELD) that a park gate refused; `reason` names the gate."""

    reason: str
    done: int
    total: int
    id: int | None = None


@dataclass(frozen=True)
class Defer:
    """A GEN or RESUME the engine did not take now (`memory`: its blocks cannot be had yet; `busy`:
    the engine's cap on running requests): the request stays queued (or parked), nothing is lost."""

    reason: str
    id: int | None = None


DEFER_REASONS = ("memory", "busy")


@dataclass(frozen=True)
class Fingerprint:
    """State fingerprint: a hash of everything the rest of the request reads."""

    stage: str
    pos: int
    digest: str
    id: int | None = None


@dataclass(frozen=True)
class Done:
    generated: int
    prompt_tokens: int
    prompt_ms: float
    decode_ms: float
    finish: str
    extra: dict[str, str] = field(default_factory=dict)
    id: int | None = None


@dataclass(frozen=True)
class Err:
    message: str
    id: int | None = None


Message = (Gen | Stop | Yield | Resume | Cancel | Quit | Info | Ready | PromptProgress | Token | Embedding | PromptLogprobs | Suspended
           | Decline | Defer | Fingerprint | Done | Err)
