"""Encode and decode protocol lines. Strict: anything off raises ProtocolError quoting the line.

Grammar (one message per line, verb first, single spaces, optional trailing ` id=N`):
  GEN <max_new> [k=v ...] <tokens>     STOP   YIELD   RESUME   CANCEL   QUIT
  INFO [k=v ...]   READY <ctx> [cap ...]   PP <done> <total> <ms> <tok/s>   T <token> [lp= top=]   EMB <dim> <base64>
  PLP <start> <lp,lp,...> [top=id:lp,...;...]
  SUSPENDED <done> <total>   DECLINE <reason> <done> <total>   DEFER <reason>   FP <stage> <pos> <hex>
  DONE <generated> <prompt_tokens> <prompt_ms> <decode_ms> <finish> [k=v ...]   ERR <text>
Free text is backslash-escaped so that it never holds a newline: INFO and DONE values also escape
space and `=`; ERR text keeps them, except a text without an id that would read as an id suffix.
EMB's vector is its `dim` float32 values, little-endian, in standard base64 (exact, and a third of decimal's
length). GEN's <tokens> are written `b64:` and the ids' uint32 values, little-endian, in standard base64; a line typed
by hand may give them in decimal, `1,2,3`.
"""
from __future__ import annotations

import base64
import binascii
import re
import sys
from array import array

from protocol import messages as m


class ProtocolError(ValueError):
    """A line that does not parse; the message quotes the line. `id` is the line's id if readable."""

    def __init__(self, message: str, ident: int | None = None):
        super().__init__(message)
        self.id = ident


TOKENS_B64 = "b64:"  # a GEN token list in base64 (format_tokens) starts so
_U32 = next(code for code in "IL" if array(code).itemsize == 4)  # the array typecode of a uint32
_INT = re.compile(r"-?[0-9]+\Z")
_FLOAT = re.compile(r"-?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?\Z")
_WORD = re.compile(r"[A-Za-z0-9_.:/+-]+\Z")
_ESCAPES = {"\\": "\\\\", "\n": "\\n", "\r": "\\r", "=": "\\e", " ": "\\s"}
_UNESCAPES = {"\\": "\\", "n": "\n", "r": "\r", "e": "=", "s": " "}


# ---------------------------------------------------------------- escaping

def escape(text: str) -> str:
    return "".join(_ESCAPES.get(c, c) for c in text)


def escape_err_text(text: str, has_id: bool) -> str:
    """ERR text keeps spaces and `=`; only a text that would read as an id suffix is escaped."""
    out = "".join(c if c in " =" else _ESCAPES.get(c, c) for c in text)
    ident, head = (None, out) if has_id else _id_suffix(out)
    return out if ident is None else head + out[len(head):].replace("=", "\\e")


def unescape(text: str, allow_equals: bool = False) -> str:
    out, i = [], 0
    while i < len(text):
        c = text[i]
        if (c == "=" and not allow_equals) or c == "\n":
            raise ValueError(f"unescaped {c!r} in text")
        if c != "\\":
            out.append(c)
            i += 1
            continue
        if i + 1 >= len(text) or text[i + 1] not in _UNESCAPES:
            raise ValueError("bad escape in text")
        out.append(_UNESCAPES[text[i + 1]])
        i += 2
    return "".join(out)


# ---------------------------------------------------------------- field parsers

def parse_int(s: str, what: str, minimum: int | None = 0) -> int:
    if not _INT.match(s):
        raise ValueError(f"{what} must be an integer, got {s!r}")
    v = int(s)
    if minimum is not None and v < minimum:
        raise ValueError(f"{what} must be >= {minimum}, got {v}")
    return v


def parse_float(s: str, what: str) -> float:
    if not _FLOAT.match(s):
        raise ValueError(f"{what} must be a number, got {s!r}")
    return float(s)


def parse_word(s: str, what: str, allowed: tuple[str, ...] | None = None) -> str:
    if not _WORD.match(s) or (allowed is not None and s not in allowed):
        expected = f" (one of {', '.join(allowed)})" if allowed else ""
        raise ValueError(f"bad {what} {s!r}{expected}")
    return s


def _base64_le(values: array) -> str:
    """An array's values, little-endian, in standard base64 (EMB's vector, GEN's tokens)."""
    if sys.byteorder != "little":
        values.byteswap()
    return base64.b64encode(values.tobytes()).decode("ascii")


def _array_le(code: str, raw: bytes) -> array:
    """The values of `code` that _base64_le's bytes hold (a whole number of them)."""
    values = array(code)
    values.frombytes(raw)
    if sys.byteorder != "little":
        values.byteswap()
    return values


def format_tokens(tokens) -> str:
    """A GEN line's token ids as TOKENS_B64 and their uint32 values, little-endian, in standard base64: a prompt's
    line is written and read at C speed (the decimal list took ~1.3 ms to write and ~1.9 ms to read for 6K tokens,
    on the server's one event loop and between the engine's steps)."""
    return TOKENS_B64 + _base64_le(array(_U32, tokens))


def parse_tokens(s: str) -> tuple[int, ...]:
    """TOKENS_B64 and base64 (as format_tokens writes them), or decimal ids between single commas (as typed)."""
    if s.startswith(TOKENS_B64):
        try:
            raw = base64.b64decode(s[len(TOKENS_B64):], validate=True)
        except binascii.Error as e:
            raise ValueError(f"bad base64 token list: {e}") from None
        if not raw or len(raw) % 4:
            raise ValueError(f"a base64 token list holds whole uint32 ids, got {len(raw)} bytes")
        return tuple(_array_le(_U32, raw))
    if not s:
        raise ValueError("empty token list")
    digits = s.replace(",", "")  # ASCII digits between single commas: checked at C speed for a 97K-token prompt
    if digits.isascii() and digits.isdigit() and ",," not in s and s[0] != "," and s[-1] != ",":
        return tuple(map(int, s.split(",")))
    return tuple(parse_int(t, "token id") for t in s.split(","))  # raises, naming the bad id


def parse_kv(parts: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for p in parts:
        k, sep, v = p.partition("=")
        if not sep or not _WORD.match(k) or k in out:
            raise ValueError(f"bad key=value field {p!r}")
        out[k] = unescape(v)
    return out


def parse_gen_params(parts: list[str]) -> dict:
    params = {}
    for k, v in parse_kv(parts).items():
        kind = m.GEN_KEYS.get(k)
        if kind is None:
            raise ValueError(f"unknown GEN key {k!r}")
        if kind is int:
            params[k] = parse_int(v, k, minimum=None)
        elif kind is float:
            params[k] = parse_float(v, k)
        elif kind is str:
            params[k] = v
        else:
            params[k] = parse_tokens(v)
    return params


def format_number(x: float) -> str:
    return repr(float(x)) if x == x and abs(x) != float("inf") else "0.0"


def format_kv(d: dict) -> list[str]:
    return [f"{k}={_format_value(v)}" for k, v in d.items()]


def _format_value(v) -> str:
    if isinstance(v, tuple):
        return ",".join(str(t) for t in v)
    if isinstance(v, float):
        return format_number(v)
    return escape(str(v))


def _format_top(top: tuple[tuple[int, float], ...]) -> str:
    return ",".join(f"{t}:{format_number(lp)}" for t, lp in top)


def parse_top(s: str) -> tuple[tuple[int, float], ...]:
    """T's top=id:lp,id:lp list."""
    out = []
    for item in s.split(","):
        t, sep, lp = item.partition(":")
        if not sep:
            raise ValueError(f"bad top entry {item!r}")
        out.append((parse_int(t, "token id"), parse_float(lp, "logprob")))
    return tuple(out)


def format_vector(vector: tuple[float, ...]) -> str:
    """EMB's vector: float32 values, little-endian, base64."""
    return _base64_le(array("f", vector))


def parse_vector(s: str, dim: int) -> tuple[float, ...]:
    try:
        raw = base64.b64decode(s, validate=True)
    except binascii.Error:
        raise ValueError("the vector is not base64") from None
    if len(raw) != 4 * dim:
        raise ValueError(f"the vector holds {len(raw)} bytes, not {dim} float32 values")
    return tuple(_array_le("f", raw))


# ---------------------------------------------------------------- encode

def encode(msg: m.Message) -> str:
    """Message -> one line, without the newline."""
    body = _ENCODERS[type(msg)](msg)
    return body if msg.id is None else f"{body} id={msg.id}"


def verb(msg: m.Message) -> str:
    """The line's first word, its type on the wire (PP for a PromptProgress, T for a Token...)."""
    return encode(msg).split(" ", 1)[0]


_ENCODERS = {
    m.Gen: lambda g: " ".join(["GEN", str(g.max_new), *format_kv(g.params), format_tokens(g.tokens)]),
    m.Stop: lambda _: "STOP",
    m.Yield: lambda _: "YIELD",
    m.Resume: lambda _: "RESUME",
    m.Cancel: lambda _: "CANCEL",
    m.Quit: lambda _: "QUIT",
    m.Info: lambda i: " ".join(["INFO", *format_kv(i.fields)]),
    m.Ready: lambda r: " ".join(["READY", str(r.ctx), *r.caps]),
    m.PromptProgress: lambda p: f"PP {p.done} {p.total} {format_number(p.ms)} {format_number(p.tok_s)}",
    m.Token: lambda t: " ".join([f"T {t.token}", *([f"lp={format_number(t.logprob)}"] if t.logprob is not None else []),
                                 *([f"top={_format_top(t.top)}"] if t.top else [])]),
    m.Embedding: lambda e: f"EMB {len(e.vector)} {format_vector(e.vector)}",
    m.PromptLogprobs: lambda p: " ".join([f"PLP {p.start}", ",".join(map(format_number, p.logprobs)),
                                          *([f"top={';'.join(_format_top(t) for t in p.top)}"] if p.top else [])]),
    m.Suspended: lambda s: f"SUSPENDED {s.done} {s.total}",
    m.Decline: lambda d: f"DECLINE {d.reason} {d.done} {d.total}",
    m.Defer: lambda d: f"DEFER {d.reason}",
    m.Fingerprint: lambda f: f"FP {f.stage} {f.pos} {f.digest}",
    m.Done: lambda d: " ".join(
        ["DONE", str(d.generated), str(d.prompt_tokens), format_number(d.prompt_ms),
         format_number(d.decode_ms), d.finish, *format_kv(d.extra)]),
    m.Err: lambda e: f"ERR {escape_err_text(e.message, e.id is not None)}" if e.message else "ERR",
}


# ---------------------------------------------------------------- decode

def decode(line: str) -> m.Message:
    """One line (a trailing newline is allowed) -> Message, or ProtocolError quoting it."""
    text = line[:-1] if line.endswith("\n") else line
    try:
        return _decode(text)
    except ValueError as e:
        raise ProtocolError(f"{e}: {text!r}", _id_suffix(text)[0]) from None


def _id_suffix(text: str) -> tuple[int | None, str]:
    """A line's trailing id=N field (after a space, or the whole line), and the line before it;
    found without scanning the line (a GEN line of a long prompt is hundreds of kilobytes)."""
    head, _, last = text.rpartition(" ")
    number = last[3:]
    if last.startswith("id=") and number.isascii() and number.isdigit():
        return int(number), head
    return None, text


def _decode(text: str) -> m.Message:
    ident, text = _id_suffix(text)
    verb, _, rest = text.partition(" ")
    if verb == "ERR":
        return m.Err(unescape(rest, allow_equals=True), ident)
    if verb not in _DECODERS:
        raise ValueError(f"unknown verb {verb!r}")
    parts = rest.split(" ") if rest else []
    if any(p == "" for p in parts):
        raise ValueError("empty field (double or trailing space)")
    return _DECODERS[verb](parts, ident)


def _fields(parts: list[str], n: int, verb: str, at_least: bool = False) -> list[str]:
    if len(parts) < n or (not at_least and len(parts) != n):
        raise ValueError(f"{verb} takes {'at least ' if at_least else ''}{n} fields, got {len(parts)}")
    return parts


def _needs_id(verb: str, ident: int | None) -> int:
    if ident is None:
        raise ValueError(f"{verb} needs id=N")
    return ident


def _gen(p, i):
    _fields(p, 2, "GEN", at_least=True)
    return m.Gen(parse_int(p[0], "max_new"), parse_tokens(p[-1]), parse_gen_params(p[1:-1]), i)


def _done(p, i):
    _fields(p, 5, "DONE", at_least=True)
    return m.Done(parse_int(p[0], "generated"), parse_int(p[1], "prompt_tokens"),
                  parse_float(p[2], "prompt_ms"), parse_float(p[3], "decode_ms"),
                  parse_word(p[4], "finish", m.FINISH_REASONS), parse_kv(p[5:]), i)


def _token(p, i):
    _fields(p, 1, "T", at_least=True)
    extra = parse_kv(p[1:])
    if set(extra) - {"lp", "top"}:
        raise ValueError(f"unknown T field {sorted(set(extra) - {'lp', 'top'})[0]!r}")
    logprob = parse_float(extra["lp"], "lp") if "lp" in extra else None
    return m.Token(parse_int(p[0], "token"), i, logprob, parse_top(extra["top"]) if "top" in extra else ())


def _prompt_logprobs(p, i):
    _fields(p, 2, "PLP", at_least=True)
    values = tuple(parse_float(v, "logprob") for v in p[1].split(","))
    extra = parse_kv(p[2:])
    if set(extra) - {"top"}:
        raise ValueError(f"unknown PLP field {sorted(set(extra) - {'top'})[0]!r}")
    top = tuple(parse_top(t) if t else () for t in extra["top"].split(";")) if "top" in extra else ()
    if top and len(top) != len(values):
        raise ValueError(f"PLP has {len(values)} logprobs but {len(top)} top lists")
    return m.PromptLogprobs(parse_int(p[0], "start"), values, top, i)


def _embedding(p, i):
    _fields(p, 2, "EMB")
    return m.Embedding(parse_vector(p[1], parse_int(p[0], "dim", minimum=1)), i)


def _ready(p, i):
    _fields(p, 1, "READY", at_least=True)
    return m.Ready(parse_int(p[0], "ctx", minimum=1), tuple(parse_word(c, "capability") for c in p[1:]), i)


def _pp(p, i):
    _fields(p, 4, "PP")
    return m.PromptProgress(parse_int(p[0], "done"), parse_int(p[1], "total"), parse_float(p[2], "ms"),
                parse_float(p[3], "tok/s"), i)


def _fp(p, i):
    _fields(p, 3, "FP")
    if not re.fullmatch(r"[0-9a-f]+", p[2]):
        raise ValueError(f"bad digest {p[2]!r}")
    return m.Fingerprint(parse_word(p[0], "stage", m.FINGERPRINT_STAGES), parse_int(p[1], "pos"), p[2], i)


def _bare(cls, verb):
    def decode_bare(parts, ident):
        _fields(parts, 0, verb)
        return cls(ident)
    return decode_bare


def _with_id(cls, verb):
    def decode_with_id(parts, ident):
        _fields(parts, 0, verb)
        return cls(_needs_id(verb, ident))
    return decode_with_id


_DECODERS = {
    "GEN": _gen,
    "STOP": _bare(m.Stop, "STOP"),
    "YIELD": _bare(m.Yield, "YIELD"),
    "RESUME": _with_id(m.Resume, "RESUME"),
    "CANCEL": _with_id(m.Cancel, "CANCEL"),
    "QUIT": _bare(m.Quit, "QUIT"),
    "INFO": lambda p, i: m.Info(parse_kv(p), i),
    "READY": _ready,
    "PP": _pp,
    "T": _token,
    "EMB": _embedding,
    "PLP": _prompt_logprobs,
    "SUSPENDED": lambda p, i: m.Suspended(parse_int(_fields(p, 2, "SUSPENDED")[0], "done"),
                                          parse_int(p[1], "total"), i),
    "DECLINE": lambda p, i: m.Decline(parse_word(_fields(p, 3, "DECLINE")[0], "reason"),
                                      parse_int(p[1], "done"), parse_int(p[2], "total"), i),
    "DEFER": lambda p, i: m.Defer(parse_word(_fields(p, 1, "DEFER")[0], "reason", m.DEFER_REASONS),
                                  _needs_id("DEFER", i)),
    "FP": _fp,
    "DONE": _done,
}
