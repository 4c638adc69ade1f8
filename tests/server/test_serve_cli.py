"""``vllm serve``'s command line with the plugin on CPU: bad --spec-extend
setups and a short API key stop it at startup with one line and no
traceback; ``--help`` shows the SpecExtend group. Each case is a run of the
``vllm`` script's ``main`` in a process of its own, forked from one that
imported vLLM's CLI once (``warm_cli.py``): the failures run in the
background lane (``background.py``) beside the rest of the suite, the two
``--help`` runs in the test."""

from __future__ import annotations

import subprocess

import background
import pytest
from cpu_serve import COMMON, ENV, MIDDLEWARE, spec_args
from warm_cli import WarmCli

from benchmarks.harness.server import free_port
from vllm_specextend.serving.auth import KEY_ENV
from vllm_specextend.serving.snapshots import METRICS_DIR_ENV

pytestmark = pytest.mark.server


def _bad_args(case: str, draft: str) -> list[str]:
    if case == "no-draft":
        return ["--spec-extend", "{}"]
    if case == "ngram":
        return ["--spec-extend", "--speculative-config", '{"method": "ngram", '
                '"num_speculative_tokens": 3, "prompt_lookup_max": 3}']
    return spec_args(draft, {
        "unknown-key": '{"bogus": 1}',
        "top-k": '{"top_k": 0}',
        "not-json": "not json",
        "chunk-vs-block": '{"chunk_size": 48, "sink_tokens": 0}',
    }[case])


# (case, exit status, the one line's text)
BAD_CONFIGS = [
    # Parse time: argparse's usage error.
    ("unknown-key", 2, "Unknown spec_extend key"),
    ("top-k", 2, "spec_extend.top_k=0 must be"),
    ("not-json", 2, "expects a JSON object"),
    # Engine-config time: one line too, from the plugin's excepthook.
    ("no-draft", 1, "vllm: error: --spec-extend needs a draft model"),
    ("chunk-vs-block", 1, "must be a multiple of the KV block size 32"),
    ("ngram", 1, "vllm: error: --spec-extend supports the speculative methods"),
]


CLI = WarmCli(ENV)


def _vllm(argv, listen: bool = True, env: dict | None = None, timeout_s: float = 180):
    """The starter of a background job (``background.py``): ``vllm ARGV``
    (``argv(fixture)``) to its end, output captured; ``env`` added to ENV;
    ``listen``: on a free port. On a timeout it is stopped with its whole
    session (an engine a wrongly started server spawned too), not alone."""
    def start(fixture):
        args = argv(fixture)
        snapshots = fixture("tmp_path_factory").mktemp("cli")
        full_env = {**ENV, METRICS_DIR_ENV: str(snapshots), **(env or {})}

        def job():
            # Picked when it runs: a port picked at the session's start could
            # be taken by then.
            port = ["--host", "127.0.0.1", "--port", str(free_port())] if listen else []
            return CLI.run([*args, *port], full_env, timeout_s)
        return job
    return start


def _bad_config(case: str):
    return _vllm(lambda fixture: ["serve", fixture("tiny_target"),
                                  *_bad_args(case, fixture("tiny_draft")), *COMMON])


BACKGROUND = {
    **{f"bad-config-{case}": _bad_config(case) for case, _, _ in BAD_CONFIGS},
    "short-api-key": _vllm(lambda fixture: ["serve", fixture("tiny_target"),
                                            *MIDDLEWARE, *COMMON],
                           env={KEY_ENV: "k" * 31}),
}


def _help(argv: list[str]) -> subprocess.CompletedProcess:
    """``vllm ARGV`` to its end, from the test: the lane's jobs outlast the
    rest of the suite, so these two short runs stay out of it."""
    return CLI.run(argv, ENV, 180)


@pytest.mark.parametrize("case, status, message", BAD_CONFIGS)
def test_bad_config_fails_at_startup(request, case, status, message):
    """Bad --spec-extend setups stop ``vllm serve`` with our message on one
    line and no traceback."""
    proc = background.result(request, f"bad-config-{case}")
    output = proc.stdout + proc.stderr
    assert proc.returncode == status, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    lines = [line for line in output.splitlines() if message in line]
    assert len(lines) == 1, output[-3000:]


def test_short_api_key_fails_at_startup(request):
    """The plugin's middleware with a key under 32 characters: ``vllm serve``
    stops while parsing its arguments (exit 2, one line naming the fix, no
    traceback). Without that check the server would start and answer 500
    everywhere (Starlette builds middleware on the lifespan event, whose
    errors uvicorn's lifespan "auto" swallows): the call would time out."""
    proc = background.result(request, "short-api-key")
    output = proc.stdout + proc.stderr
    assert proc.returncode == 2, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    lines = [line for line in output.splitlines() if "openssl rand -hex 32" in line]
    assert len(lines) == 1, output[-3000:]
    assert f"argument --middleware: {KEY_ENV} is too short" in lines[0]


def test_help_shows_the_spec_extend_group():
    """``vllm serve --help`` lists the group with its flags; ``--help=SpecExtend``
    shows the flags' help."""
    plain = _help(["serve", "--help"])
    assert plain.returncode == 0, plain.stderr[-3000:]
    group = [line for line in plain.stdout.splitlines()
             if line.strip().startswith("SpecExtend ")]
    assert len(group) == 1, plain.stdout[-3000:]
    assert "--spec-extend" in group[0] and "--speculative-model" in group[0]
    section = _help(["serve", "--help=SpecExtend"])
    assert section.returncode == 0, section.stderr[-3000:]
    assert "No group or arguments matching" not in section.stdout
    for flag in ("--spec-extend", "--speculative-model", "--num-speculative-tokens"):
        assert flag in section.stdout, section.stdout[-3000:]
