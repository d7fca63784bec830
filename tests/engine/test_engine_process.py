"""`strata --serve` over its pipes with the default model, and `strata "prompt"` at a terminal."""
import json
import subprocess
from pathlib import Path

import pytest

from protocol import messages as m
from protocol.codec import decode
from tests.harness import PY, ROOT, EngineProcess

CASES = json.loads((Path(__file__).parent.parent / "fixtures/logits_golden.json").read_text())["cases"]
FRANCE = tuple(CASES[0]["ids"])


@pytest.fixture(scope="module")
def engine():
    e = EngineProcess([PY, "-m", "engine", "--serve", "--device", "cpu", "--chunk", "16", "--ctx", "1024"])
    ready = e.handshake()
    assert ready.ctx == 1024 and "stop" in ready.caps
    yield e
    assert e.close() == 0


def test_info_names_model_device_and_chunk(engine):
    info = decode(engine.lines[0])
    assert isinstance(info, m.Info)
    assert info.fields["chunk"] == "16" and info.fields["device"].startswith("cpu")
    assert "Smollm2" in info.fields["model"]


def test_an_embedding_from_a_model_whose_file_names_no_pooling_is_refused(engine):
    """SmolLM2's file has no llama.pooling_type: an embed request is refused (--pooling would serve it)."""
    assert engine.info["pooling"] == "unset"
    engine.send(m.Gen(1, FRANCE, {"embed": 1}, 7))
    err = engine.read_until(m.Err, ident=7)[-1]
    assert "names no pooling" in err.message and "--pooling mean|cls|last" in err.message


def test_gen_reads_in_absolute_chunks_then_answers_paris(engine, tokenizer):
    engine.send(m.Gen(20, FRANCE, {"temperature": 0.0}, 1))
    got = engine.read_until(m.Done, ident=1)
    assert [p.done for p in got if isinstance(p, m.PromptProgress)] == [16, 32, 37]
    tokens = [t.token for t in got if isinstance(t, m.Token)]
    assert tokenizer.decode(tokens) == "The capital of France is Paris."
    done = got[-1]
    assert (done.finish, done.generated, done.prompt_tokens) == ("stop", len(tokens), 37)


def test_seeded_sampling_repeats_exactly(engine):
    runs = []
    for ident in (2, 3):
        engine.send(m.Gen(12, FRANCE, {"temperature": 0.9, "seed": 1234}, ident))
        runs.append([t.token for t in engine.read_until(m.Done, ident=ident) if isinstance(t, m.Token)])
    assert runs[0] == runs[1] and runs[0]


def test_stop_between_tokens(engine):
    engine.send(m.Gen(500, FRANCE, {"temperature": 1.0, "seed": 1, "stop": (99999,)}, 4))
    engine.read_until(m.Token, ident=4)
    engine.send(m.Stop(4))
    done = engine.read_until(m.Done, ident=4)[-1]
    assert done.finish in ("cancel", "stop") and done.generated < 500


def test_a_grammar_on_gen_constrains_the_tokens(engine, tokenizer):
    """GEN's grammar (llguidance's text, escaped on the wire): the answer to the France prompt is made
    to be one of two words, whatever the model prefers."""
    import llguidance

    grammar = llguidance.LLMatcher.grammar_from_regex("(Lyon|Marseille)")
    engine.send(m.Gen(20, FRANCE, {"temperature": 0.0, "grammar": grammar}, 11))
    got = engine.read_until(m.Done, ident=11)
    text = tokenizer.decode([t.token for t in got if isinstance(t, m.Token)])
    assert text in ("Lyon", "Marseille") and got[-1].finish == "stop"


def test_bad_lines_get_err_naming_the_problem_and_serving_goes_on(engine, tokenizer):
    def err() -> m.Err:  # the next ERR, past any pool report (INFO without an id) earlier tests left unread
        return engine.read_until(m.Err)[-1]

    engine.send("GEN 5 warp=9 1,2,3 id=5")
    e = err()
    assert e.id == 5 and "warp" in e.message
    engine.send(m.Gen(5, tuple(range(1, 1100)), {}, 6))
    e = err()
    assert e.id == 6 and "context" in e.message
    engine.send(m.Gen(5, (1, 60000), {}, 7))
    assert "vocabulary" in err().message
    engine.send(m.Gen(5, (1, 2), {"top_p": 0.0}, 8))
    assert "top_p" in err().message
    engine.send("HELLO there")
    assert "unknown verb" in err().message
    engine.send(m.Gen(5, FRANCE, {"grammar": '{"grammars": [{"lark_grammar": "start: ("}]}'}, 10))
    assert err().message.startswith("grammar")
    engine.send("GEN 5 warp=9 1,2,3 id=11")  # a client waiting for this request's DONE learns at once
    with pytest.raises(RuntimeError, match="request 11: unknown GEN key 'warp'"):
        engine.read_until(m.Done, ident=11)
    engine.send(m.Gen(20, FRANCE, {}, 9))
    tokens = [t.token for t in engine.read_until(m.Done, ident=9) if isinstance(t, m.Token)]
    assert "Paris" in tokenizer.decode(tokens)


def test_terminal_mode_streams_an_answer():
    out = subprocess.run([PY, "-m", "engine", "What is the capital of France?", "--device", "cpu"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "Paris" in out.stdout


def test_missing_model_file_is_a_clear_error_and_nonzero_exit(tmp_path):
    out = subprocess.run([PY, "-m", "engine", "--serve", "--model", str(tmp_path / "nope.gguf")],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == m.START_REFUSED and "model file not found" in out.stderr
    assert decode(out.stdout.splitlines()[-1]) == m.Err(f"model file not found: {tmp_path / 'nope.gguf'}")  # (the server)


def test_unsupported_architecture_is_refused_by_name(tmp_path):
    import gguf

    path = tmp_path / "mamba.gguf"
    w = gguf.GGUFWriter(str(path), "mamba")
    w.add_block_count(1)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    out = subprocess.run([PY, "-m", "engine", "--serve", "--model", str(path)],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == m.START_REFUSED and "unsupported architecture 'mamba'" in out.stderr


def test_a_reused_start_gives_the_tokens_and_state_of_a_cold_read(engine):
    """The next turn of a conversation reads only what is new: the prefix cache holds the previous
    prompt's whole chunks. Reuse is rounded down to a chunk boundary, so the tokens and the state
    fingerprint equal those of a cold read of the same prompt (reuse=0)."""
    engine.send(m.Gen(8, FRANCE, {"temperature": 0.0}, 20))
    engine.read_until(m.Done, ident=20)
    turn = FRANCE + tuple(CASES[1]["ids"])
    runs = {}
    for ident, reuse in ((21, 1), (22, 0)):
        engine.send(m.Gen(12, turn, {"temperature": 0.0, "seed": 0, "fp": 1, "reuse": reuse}, ident))
        got = engine.read_until(m.Done, ident=ident)
        info = next(x for x in got if isinstance(x, m.Info) and "cached" in x.fields)  # not the pool's report
        runs[reuse] = (int(info.fields["cached"]), [x.token for x in got if isinstance(x, m.Token)], got[-1].extra["fp"])
    assert runs[1][0] == 32 and runs[0][0] == 0  # FRANCE's 37 tokens hold two whole chunks of 16
    assert runs[1][1:] == runs[0][1:]


def test_a_read_that_pauses_for_decode_steps_gives_the_tokens_and_state_of_a_straight_read(engine_factory):
    """Real model, two slots: a read while another request decodes, pausing after every layer for
    its decode steps (--decode-interval-ms tiny), ends with the same tokens and state fingerprint
    as the same read alone; the decoder's tokens are its solo ones too."""
    e = engine_factory("--device", "cpu", "--chunk", "16", "--ctx", "1024", "--slots", "2", "--no-prompt-reuse",
                       "--decode-interval-ms", "0.001")
    e.handshake()
    long_prompt = FRANCE + tuple(CASES[1]["ids"]) + FRANCE
    params = {"temperature": 0.0, "seed": 0, "fp": 1}

    def run_alone(ident: int, tokens: tuple, n: int):
        e.send(m.Gen(n, tokens, params, ident))
        got = e.read_until(m.Done, ident=ident)
        return [x.token for x in got if isinstance(x, m.Token)], got[-1].extra["fp"]

    alone = {"read": run_alone(1, long_prompt, 6), "decoder": run_alone(2, FRANCE, 60)}
    e.send(m.Gen(60, FRANCE, params, 3))
    seen = e.read_until(m.Token, ident=3)
    e.send(m.Gen(6, long_prompt, params, 4))
    seen += e.read_until(m.Done, ident=4)
    if not any(isinstance(x, m.Done) and x.id == 3 for x in seen):
        seen += e.read_until(m.Done, ident=3)
    gen, first_pp = (next(i for i, x in enumerate(seen) if isinstance(x, kind) and x.id == 4) for kind in (m.Info, m.PromptProgress))
    assert sum(isinstance(x, m.Token) and x.id == 3 for x in seen[gen:first_pp]) > 2  # its first chunk paused
    together = {k: ([x.token for x in seen if isinstance(x, m.Token) and x.id == i],
                    next(x for x in seen if isinstance(x, m.Done) and x.id == i).extra["fp"])
                for k, i in (("read", 4), ("decoder", 3))}
    assert together == alone


def test_the_engine_with_its_defaults_reads_in_shared_steps_and_answers(tokenizer):
    """No --chunk, as the server starts it: the CPU's default chunk, and the start-up check finds rows
    that do not depend on the step (INFO shape_free), so reads share steps."""
    e = EngineProcess([PY, "-m", "engine", "--serve", "--device", "cpu", "--ctx", "1024"])
    try:
        e.handshake()
        assert e.info["chunk"] == "256" and e.info["shape_free"] == "1"
        e.send(m.Gen(20, FRANCE, {"temperature": 0.0}, 1))
        got = e.read_until(m.Done, ident=1)
        assert tokenizer.decode([t.token for t in got if isinstance(t, m.Token)]) == "The capital of France is Paris."
    finally:
        assert e.close() == 0


def test_gpu_memory_on_the_cpu_is_said_to_be_ignored():
    e = EngineProcess([PY, "-m", "engine", "--serve", "--device", "cpu", "--ctx", "1024", "--gpu-memory", "8"])
    e.handshake()
    assert e.close() == 0 and "--gpu-memory applies to a GPU: ignored on the CPU" in "".join(e.stderr)
