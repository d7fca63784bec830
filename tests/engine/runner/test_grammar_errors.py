"""A token the grammar refuses after its own mask allowed it ends the request with an ERR its client
sees, never silently, and the engine goes on. Staged on the real Qwen2.5 fixture (`make fixture`)
with the grammar the server wrote before it knew added tokens: the call marker as text only. The
mask then offers Qwen's added token <tool_call> (llguidance tokenizes the forced text into it) and
the grammar, which reads that token as a special one, refuses it."""
import llguidance

from protocol import messages as m
from tests.harness import NO_WEIGHT_CACHE
from tools.fixtures.fetch_fixture import fixture_path


def test_a_token_the_grammar_refuses_is_an_err_and_the_next_request_runs(engine_factory):
    model = fixture_path()
    assert model.is_file(), f"{model} is missing: `make fixture` fetches it"
    engine = engine_factory("--model", str(model), "--device", "cpu", env=NO_WEIGHT_CACHE)
    engine.handshake()
    text_only = llguidance.LLMatcher.grammar_from_lark('start: "<tool_call>\\n" "{}"\n')
    engine.send(m.Gen(8, (9707, 11, 1879), {"temperature": 0.0, "grammar": text_only}, 1))
    lines = engine.read_until(m.Err, ident=1)
    assert not any(isinstance(x, m.Token) for x in lines)
    assert "refused by the grammar" in lines[-1].message
    both = llguidance.LLMatcher.grammar_from_lark('start: ("<tool_call>" | <[151657]>) "\\n" "{}"\n')
    engine.send(m.Gen(8, (9707, 11, 1879), {"temperature": 0.0, "grammar": both}, 2))
    lines = engine.read_until(m.Done, ident=2)
    tokens = [x.token for x in lines if isinstance(x, m.Token)]
    assert tokens[0] in (151657, 27) and lines[-1].finish == "stop"  # the token, or the text from "<" on
