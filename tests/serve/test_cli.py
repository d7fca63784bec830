"""The server's command line: what it forwards to the default engine, and what it refuses."""
from __future__ import annotations

import pytest

from engine.cli import build_parser as engine_parser
from serve.cli import build_parser, settings_from_args


def engine_args(*flags: str) -> list[str]:
    return settings_from_args(build_parser().parse_args(list(flags))).engine_command()


@pytest.mark.parametrize("flag, value", [("--weights", "fp16"), ("--prompt-weights", "per-step")])
def test_a_weights_form_is_forwarded_only_when_given(flag, value):
    assert flag not in engine_args()
    cmd = engine_args(flag, value)
    assert cmd[cmd.index(flag) + 1] == value
    parsed = vars(engine_parser().parse_args(cmd[cmd.index("--serve"):]))  # the engine takes it
    assert parsed[flag[2:].replace("-", "_")] == value


@pytest.mark.parametrize("parser", [build_parser, engine_parser])
@pytest.mark.parametrize("flag", ["--weights", "--prompt-weights"])
def test_an_unknown_weights_form_is_refused(parser, flag, capsys):
    with pytest.raises(SystemExit) as e:
        parser().parse_args([flag, "int3"])
    assert e.value.code == 2 and "invalid choice: 'int3'" in capsys.readouterr().err


@pytest.mark.parametrize("flag, field", [("--decode-interval-ms", "decode_interval_ms"), ("--step-ms", "step_ms"),
                                         ("--burst-ms", "burst_ms")])
def test_a_step_bound_is_forwarded_only_when_given_and_a_negative_one_refused(flag, field):
    assert flag not in engine_args()
    cmd = engine_args(flag, "20")
    assert getattr(engine_parser().parse_args(cmd[cmd.index("--serve"):]), field) == 20.0  # the engine takes it
    with pytest.raises(ValueError, match=f"{flag} must be >= 0"):
        engine_args(flag, "-1")


def test_a_draft_model_is_forwarded_with_its_mode_and_refused_without_it(model_path):
    cmd = engine_args("--speculative", "draft", "--draft", model_path, "--draft-max", "4")
    parsed = engine_parser().parse_args(cmd[cmd.index("--serve"):])  # the engine takes them
    assert (parsed.speculative, parsed.draft, parsed.draft_max) == ("draft", model_path, 4)
    assert "--draft" not in engine_args("--speculative", "ngram")
    for flags in (["--speculative", "draft"], ["--draft", model_path]):
        with pytest.raises(ValueError, match="--speculative draft takes its draft model from --draft FILE"):
            engine_args(*flags)
    with pytest.raises(ValueError, match="--draft serves one model"):
        engine_args("--speculative", "draft", "--draft", model_path, "--model", model_path, "--model", f"b={model_path}")
