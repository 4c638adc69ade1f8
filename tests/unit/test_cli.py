"""``--spec-extend`` and the ``--speculative-model`` aliases on argparse parsers."""

from __future__ import annotations

import argparse
import json

import pytest

from vllm_specextend.config import SpecExtendConfig
from vllm_specextend.serving.cli import SpecExtendAction, add_spec_extend_args

DEFAULTS = SpecExtendConfig().to_dict()


def make_parser() -> argparse.ArgumentParser:
    """Mimics the parts of vLLM's parser that the plugin touches."""
    parser = argparse.ArgumentParser(prog="vllm-test")
    parser.add_argument("--model", default="m")
    parser.add_argument("--additional-config", type=json.loads, default=None)
    parser.add_argument("--spec-model", dest="spec_model", default=None)
    parser.add_argument("--spec-tokens", dest="spec_tokens", type=int, default=None)
    add_spec_extend_args(parser)
    return parser


def test_no_flag_leaves_additional_config_alone():
    args = make_parser().parse_args([])
    assert args.additional_config is None
    args = make_parser().parse_args(["--additional-config", '{"x": 1}'])
    assert args.additional_config == {"x": 1}


def test_flag_alone_gives_defaults():
    args = make_parser().parse_args(["--spec-extend"])
    assert args.additional_config == {"spec_extend": DEFAULTS}


def test_flag_alone_before_another_option():
    args = make_parser().parse_args(["--spec-extend", "--model", "x"])
    assert args.additional_config == {"spec_extend": DEFAULTS}
    assert args.model == "x"


def test_flag_with_json():
    args = make_parser().parse_args(
        ["--spec-extend", '{"top_k": 64, "policy": "streaming"}']
    )
    assert args.additional_config == {
        "spec_extend": {**DEFAULTS, "top_k": 64, "policy": "streaming"}
    }


def test_flag_with_equals_json():
    args = make_parser().parse_args(['--spec-extend={"retrieve_every": 2}'])
    assert args.additional_config["spec_extend"]["retrieve_every"] == 2


@pytest.mark.parametrize("order", ["before", "after"])
def test_merges_with_additional_config(order):
    spec = ["--spec-extend", '{"top_k": 8}']
    extra = ["--additional-config", '{"x": 1}']
    argv = spec + extra if order == "before" else extra + spec
    args = make_parser().parse_args(argv)
    assert args.additional_config == {
        "x": 1,
        "spec_extend": {**DEFAULTS, "top_k": 8},
    }


def test_bare_flag_before_additional_config_keeps_both():
    args = make_parser().parse_args(
        ["--spec-extend", "--additional-config", '{"x": 1}']
    )
    assert args.additional_config == {"x": 1, "spec_extend": DEFAULTS}


@pytest.mark.parametrize(
    "value,needle",
    [
        ("{bad", "JSON object"),
        ("[1]", "JSON object"),
        ('{"topk": 1}', "topk"),
        ('{"top_k": 0}', "top_k"),
        ('{"policy": "eagle"}', "policy"),
    ],
)
def test_bad_value_is_usage_error(value, needle, capsys):
    with pytest.raises(SystemExit) as info:
        make_parser().parse_args(["--spec-extend", value])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "--spec-extend" in err
    assert needle in err


def test_speculative_model_aliases():
    args = make_parser().parse_args(
        ["--speculative-model", "D", "--num-speculative-tokens", "3"]
    )
    assert args.spec_model == "D"
    assert args.spec_tokens == 3
    args = make_parser().parse_args(["--spec-model", "E", "--spec-tokens", "5"])
    assert (args.spec_model, args.spec_tokens) == ("E", 5)
    args = make_parser().parse_args([])
    assert (args.spec_model, args.spec_tokens) == (None, None)


def test_num_speculative_tokens_must_be_int(capsys):
    with pytest.raises(SystemExit):
        make_parser().parse_args(["--num-speculative-tokens", "three"])
    assert "--num-speculative-tokens" in capsys.readouterr().err


def test_add_twice_is_harmless():
    parser = make_parser()
    action_cls = type(parser._option_string_actions["--additional-config"])
    n_actions = len(parser._actions)
    add_spec_extend_args(parser)  # no argparse conflict error
    assert len(parser._actions) == n_actions
    assert type(parser._option_string_actions["--additional-config"]) is action_cls
    # The merging action wraps the original once.
    merging = [c for c in action_cls.__mro__ if c.__name__ == "MergingAction"]
    assert len(merging) == 1
    assert isinstance(parser._option_string_actions["--spec-extend"], SpecExtendAction)
    args = parser.parse_args(["--spec-extend", "--additional-config", '{"y": 2}'])
    assert args.additional_config == {"y": 2, "spec_extend": DEFAULTS}


def test_parser_without_additional_config():
    parser = argparse.ArgumentParser()
    add_spec_extend_args(parser)
    args = parser.parse_args(["--spec-extend", '{"top_k": 3}'])
    assert args.additional_config == {"spec_extend": {**DEFAULTS, "top_k": 3}}


def test_additional_config_non_dict_values_still_stored():
    # A non-dict value goes through the original action unchanged.
    parser = argparse.ArgumentParser()
    parser.add_argument("--additional-config", default=None)
    add_spec_extend_args(parser)
    args = parser.parse_args(["--additional-config", "plain"])
    assert args.additional_config == "plain"


# --- vLLM's own parser ----------------------------------------------------------


@pytest.fixture(scope="module")
def vllm_parser():
    from vllm_specextend import plugin

    plugin.register()
    from vllm.entrypoints.openai.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    return make_arg_parser(FlexibleArgumentParser())


def test_vllm_serve_parser_end_to_end(vllm_parser):
    from vllm.engine.arg_utils import AsyncEngineArgs

    args = vllm_parser.parse_args(
        [
            "--model", "m",
            "--speculative-model", "d",
            "--num-speculative-tokens", "4",
            "--spec-extend", '{"top_k": 64}',
        ]
    )
    engine_args = AsyncEngineArgs.from_cli_args(args)
    assert engine_args.model == "m"
    assert engine_args.additional_config["spec_extend"] == {**DEFAULTS, "top_k": 64}
    assert engine_args.spec_model == "d"
    assert engine_args.spec_tokens == 4


def test_vllm_serve_parser_merges_additional_config(vllm_parser):
    from vllm.engine.arg_utils import AsyncEngineArgs

    for argv in (
        ["--additional-config", '{"x": 1}', "--spec-extend"],
        ["--spec-extend", "--additional-config", '{"x": 1}'],
    ):
        args = vllm_parser.parse_args(["--model", "m", *argv])
        engine_args = AsyncEngineArgs.from_cli_args(args)
        assert engine_args.additional_config == {"x": 1, "spec_extend": DEFAULTS}


def test_vllm_serve_parser_bad_key(vllm_parser, capsys):
    with pytest.raises(SystemExit):
        vllm_parser.parse_args(["--model", "m", "--spec-extend", '{"nope": 1}'])
    assert "nope" in capsys.readouterr().err


def test_vllm_serve_parser_without_flag(vllm_parser):
    from vllm.engine.arg_utils import AsyncEngineArgs

    args = vllm_parser.parse_args(["--model", "m"])
    engine_args = AsyncEngineArgs.from_cli_args(args)
    assert "spec_extend" not in (engine_args.additional_config or {})


def test_vllm_serve_parser_dotted_additional_config(vllm_parser):
    # vLLM's dotted form --additional-config.KEY VALUE arrives as a dict too.
    for argv, top_k in (
        (["--spec-extend", "--additional-config.x", "1"], 64),
        (["--additional-config.x", "1", "--spec-extend", '{"top_k": 3}'], 3),
    ):
        args = vllm_parser.parse_args(["--model", "m", *argv])
        assert args.additional_config == {
            "x": 1, "spec_extend": {**DEFAULTS, "top_k": top_k}
        }


def test_vllm_serve_parser_positional_model_then_flag(vllm_parser):
    args = vllm_parser.parse_args(["m", "--spec-extend"])
    assert args.model_tag == "m"
    assert args.additional_config == {"spec_extend": DEFAULTS}


def _help(parser, argv, capsys, monkeypatch) -> str:
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    # parse_args keeps --help=KEYWORD on the class; the next parse must not see it.
    monkeypatch.setattr(FlexibleArgumentParser, "_search_keyword", None)
    with pytest.raises(SystemExit) as exit_info:
        parser.parse_args(argv)
    assert exit_info.value.code == 0
    return capsys.readouterr().out


def test_help_lists_the_group_with_its_flags(vllm_parser, capsys, monkeypatch):
    out = _help(vllm_parser, ["--help"], capsys, monkeypatch)
    # Plain --help shows one line per group: title, then its description.
    lines = [line for line in out.splitlines() if line.strip().startswith("SpecExtend")]
    assert len(lines) == 1, out[-2000:]
    for flag in ("--spec-extend", "--speculative-model", "--num-speculative-tokens"):
        assert flag in lines[0]


@pytest.mark.parametrize("keyword", ["SpecExtend", "specextend"])
def test_help_for_the_group(vllm_parser, capsys, monkeypatch, keyword):
    out = _help(vllm_parser, [f"--help={keyword}"], capsys, monkeypatch)
    assert "No group or arguments matching" not in out
    assert out.lstrip().startswith("SpecExtend:")
    for flag in ("--spec-extend", "--speculative-model", "--num-speculative-tokens"):
        assert flag in out
    assert "retrieve_every" in out  # the flag's own help


def test_config_error_hook_prints_one_line(capsys, monkeypatch):
    from vllm_specextend.config import SpecExtendConfigError
    from vllm_specextend.serving.cli import _brief

    passed = []
    hook = _brief(lambda *exc_info: passed.append(exc_info))
    monkeypatch.setattr("sys.argv", ["/venv/bin/vllm", "serve", "m"])
    try:
        try:
            raise SpecExtendConfigError("spec_extend.chunk_size=48 must be ...")
        except SpecExtendConfigError as e:
            raise RuntimeError("engine failed") from e
    except RuntimeError as e:
        hook(type(e), e, e.__traceback__)
    err = capsys.readouterr().err
    assert err == "vllm: error: spec_extend.chunk_size=48 must be ...\n"
    assert passed == []
    other = ValueError("not ours")
    hook(ValueError, other, None)
    assert passed == [(ValueError, other, None)]


def test_uncaught_config_error_ends_the_process_in_one_line():
    import subprocess
    import sys

    code = (
        "from vllm_specextend.serving import cli\n"
        "from vllm_specextend.config import SpecExtendConfigError\n"
        "cli.report_config_errors_briefly()\n"
        "cli.report_config_errors_briefly()\n"
        "raise SpecExtendConfigError('--spec-extend needs a draft model')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    last = proc.stderr.splitlines()[-1]
    assert last == "python: error: --spec-extend needs a draft model"


def test_flag_help_names_every_config_key():
    import dataclasses

    from vllm_specextend.serving.cli import HELP

    missing = [f.name for f in dataclasses.fields(SpecExtendConfig) if f.name not in HELP]
    assert not missing, f"--spec-extend's help does not name {missing}"
