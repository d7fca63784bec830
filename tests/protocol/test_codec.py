"""The line grammar: every message round-trips; anything off raises ProtocolError quoting the line."""
import pytest
from hypothesis import given, strategies as st

from protocol import messages as m
from protocol.codec import ProtocolError, decode, encode

ids = st.none() | st.integers(0, 2**40)
counts = st.integers(0, 10**7)
floats = st.floats(0, 1e9, allow_nan=False, allow_infinity=False)
words = st.from_regex(r"[A-Za-z0-9_.:/+-]{1,12}", fullmatch=True)
keys = st.from_regex(r"[a-z_]{1,10}", fullmatch=True)
text = st.text(max_size=60)  # any unicode: newlines, '=', backslashes, U+2028, ...
tokens = st.lists(st.integers(0, 200_000), min_size=1, max_size=20).map(tuple)

gen_params = st.fixed_dictionaries({}, optional={
    "temperature": floats, "top_p": floats, "top_k": st.integers(0, 100), "min_p": floats,
    "seed": st.integers(-(2**62), 2**62), "repeat_penalty": floats, "repeat_last_n": st.integers(0, 512),
    "presence_penalty": floats, "frequency_penalty": floats, "stop": tokens, "fp": st.integers(0, 1),
    "embed": st.integers(0, 1)})

messages = st.one_of(
    st.builds(m.Gen, st.integers(0, 10**6), tokens, gen_params, ids),
    st.builds(m.Stop, ids), st.builds(m.Yield, ids), st.builds(m.Quit, ids),
    st.builds(m.Resume, st.integers(0, 2**40)), st.builds(m.Cancel, st.integers(0, 2**40)),
    st.builds(m.Info, st.dictionaries(keys, text, max_size=5), ids),
    st.builds(m.Ready, st.integers(1, 10**6), st.lists(words, max_size=4).map(tuple), ids),
    st.builds(m.PromptProgress, counts, counts, floats, floats, ids),
    st.builds(m.Token, counts, ids),
    st.builds(m.Token, counts, ids, st.floats(-1e4, 0), st.lists(st.tuples(counts, st.floats(-1e4, 0)), max_size=20).map(tuple)),
    st.lists(st.floats(-1e4, 0), min_size=1, max_size=6).flatmap(lambda lps: st.builds(
        m.PromptLogprobs, counts, st.just(tuple(lps)),
        st.one_of(st.just(()), st.lists(st.lists(st.tuples(counts, st.floats(-1e4, 0)), max_size=3).map(tuple),
                                        min_size=len(lps), max_size=len(lps)).map(tuple)), ids)),
    st.builds(m.Embedding, st.lists(st.floats(width=32, allow_nan=False), min_size=1, max_size=40).map(tuple), ids),
    st.builds(m.Suspended, counts, counts, ids),
    st.builds(m.Decline, words, counts, counts, ids),
    st.builds(m.Defer, st.sampled_from(m.DEFER_REASONS), st.integers(0, 2**40)),
    st.builds(m.Fingerprint, st.sampled_from(m.FINGERPRINT_STAGES), counts, st.from_regex(r"[0-9a-f]{1,32}", fullmatch=True), ids),
    st.builds(m.Done, counts, counts, floats, floats, st.sampled_from(m.FINISH_REASONS),
              st.dictionaries(keys, text, max_size=4), ids),
    st.builds(m.Err, text, ids),
)


@given(messages)
def test_every_message_round_trips_on_one_line(msg):
    line = encode(msg)
    assert "\n" not in line and "\r" not in line
    assert decode(line + "\n") == msg


@given(text, ids)
def test_err_text_with_odd_unicode_round_trips(message, ident):
    assert decode(encode(m.Err(message, ident))) == m.Err(message, ident)


@given(st.sampled_from(["STOP", "YIELD", "T 5", "PP 1 2 3.0 4.0", "ERR oops"]), st.integers(0, 10**9))
def test_id_suffix_is_the_last_field(body, ident):
    assert decode(f"{body} id={ident}").id == ident
    assert decode(body).id is None


def test_err_text_that_looks_like_an_id_suffix_is_not_one():
    msg = m.Err("went wrong at id=7")
    assert decode(encode(msg)) == msg
    assert decode(encode(m.Err("went wrong at id=7", 3))) == m.Err("went wrong at id=7", 3)


@pytest.mark.parametrize("line, fragment", [
    ("FROB 1", "unknown verb 'FROB'"),
    ("T", "T takes at least 1 fields, got 0"),
    ("T 1 2", "bad key=value field"),
    ("T 1 lp=x", "lp must be a number"),
    ("T 1 top=5", "bad top entry"),
    ("T 1 p=1", "unknown T field"),
    ("PLP 1", "PLP takes at least 2 fields"),
    ("PLP 1 -0.5 top=1:-1;2:-2", "1 logprobs but 2 top lists"),
    ("T x", "token must be an integer"),
    ("T 1_000", "token must be an integer"),
    ("T -1", "token must be >= 0"),
    ("PP 1 2 3.0 fast", "tok/s must be a number"),
    ("PP 1 2 3.0 4.0 id=x", "PP takes 4 fields"),
    ("RESUME", "RESUME needs id=N"),
    ("CANCEL 3", "CANCEL takes 0 fields"),
    ("GEN 5 bogus=1 1,2", "unknown GEN key 'bogus'"),
    ("GEN 5 temperature=hot 1,2", "temperature must be a number"),
    ("GEN 5", "GEN takes at least 2 fields"),
    ("GEN 5 1,,2", "token id must be an integer"),
    ("GEN 5 1,2,", "token id must be an integer, got ''"),
    ("GEN 5 ,1", "token id must be an integer, got ''"),
    ("GEN 5 1,2_0", "token id must be an integer, got '2_0'"),
    ("GEN 5 1,+2", "token id must be an integer, got '+2'"),
    ("GEN 5 1,\uff12", "token id must be an integer"),
    ("GEN 5 1,-2", "token id must be >= 0, got -2"),
    ("GEN 5 b64:", "whole uint32 ids, got 0 bytes"),
    ("GEN 5 b64:AQAA", "whole uint32 ids, got 3 bytes"),
    ("GEN 5 b64:AQ$AAAA=", "bad base64 token list"),
    ("GEN 5 b64:AQAAAA", "bad base64 token list"),  # unpadded
    ("DONE 1 2 3.0 4.0 exploded", "bad finish 'exploded'"),
    ("READY", "READY takes at least 1 fields"),
    ("T 1  id=2", "empty field"),
    ("FP park 3 XYZ", "bad digest"),
    ("EMB 2 AACAPw==", "holds 4 bytes, not 2 float32 values"),
    ("EMB 1 AACAP", "not base64"),
    ("EMB 0 AACAPw==", "dim must be >= 1"),
    ("EMB 1", "EMB takes 2 fields"),
])
def test_malformed_lines_raise_an_error_that_quotes_the_line(line, fragment):
    with pytest.raises(ProtocolError) as err:
        decode(line)
    assert fragment in str(err.value)
    assert repr(line) in str(err.value)


def test_protocol_error_keeps_the_id_of_a_bad_line():
    with pytest.raises(ProtocolError) as err:
        decode("GEN 5 bogus=1 1,2 id=42")
    assert err.value.id == 42


def test_defer_names_a_known_reason_and_an_id():
    assert decode("DEFER memory id=4") == m.Defer("memory", 4)
    for bad in ("DEFER memory", "DEFER later id=4", "DEFER id=4"):
        with pytest.raises(ProtocolError):
            decode(bad)


def test_an_embedding_is_little_endian_float32_in_base64():
    """As a client decodes OpenAI's base64 (numpy.frombuffer(..., "<f4")); every float32 exactly."""
    assert encode(m.Embedding((1.0, -0.5), 3)) == "EMB 2 AACAPwAAAL8= id=3"
    assert decode("EMB 2 AACAPwAAAL8= id=3") == m.Embedding((1.0, -0.5), 3)
    tiny = 2.0 ** -149  # the least subnormal float32
    assert decode(encode(m.Embedding((float("inf"), tiny, 3.4028234663852886e38)))).vector == (
        float("inf"), tiny, 3.4028234663852886e38)


def test_a_gen_lines_tokens_are_little_endian_uint32_in_base64_and_typed_ones_are_read_too():
    """What format_tokens writes (a numpy client's frombuffer(..., "<u4") reads it); a hand-typed decimal list means
    the same message."""
    assert encode(m.Gen(5, (1, 2, 70000), {}, 3)) == "GEN 5 b64:AQAAAAIAAABwEQEA id=3"
    assert decode("GEN 5 b64:AQAAAAIAAABwEQEA id=3") == decode("GEN 5 1,2,70000 id=3") == m.Gen(5, (1, 2, 70000), {}, 3)
    assert decode(encode(m.Gen(1, (0, 2**32 - 1)))).tokens == (0, 2**32 - 1)


def test_a_long_prompts_gen_line_round_trips():
    """A GEN line of a 100K-token prompt (checked and parsed as a whole, its id found at the end)."""
    toks = tuple((i * 7919) % 150_000 for i in range(100_000))
    msg = m.Gen(1, toks, {"temperature": 0.5}, 9)
    assert decode(encode(msg) + "\n") == msg
    assert decode(encode(m.Gen(1, toks))).id is None
