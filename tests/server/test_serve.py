"""End-to-end ``vllm serve --spec-extend`` on CPU: OpenAI API, /metrics, aborts,
greedy equivalence with a plain server, startup errors for bad configs, and the
API key every deployment sets (``deploy/README.md``): the shared server runs
with ``VLLM_API_KEY`` and ``--middleware vllm_specextend.auth.ApiKeyMiddleware``
as the deployments start it."""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import stat
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import background
import pytest
from cpu_serve import COMMON, ENV, MAX_MODEL_LEN, SPEC_EXTEND, STARTUP_S, common
from waiting import wait_for

from benchmarks.harness.server import free_port, scrape, vllm_command
from benchmarks.harness.server import serve as start_server
from vllm_specextend.auth import KEY_ENV
from vllm_specextend.metrics import METRICS_DIR_ENV

pytestmark = pytest.mark.server

# The shared server requires it, as the deployments do (VLLM_API_KEY): long
# enough for the middleware's floor (auth.MIN_KEY_CHARS).
API_KEY = "test-key-" + "k" * 32
MIDDLEWARE = ["--middleware", "vllm_specextend.auth.ApiKeyMiddleware"]


def _spec_args(draft: str, spec_extend: str = SPEC_EXTEND) -> list[str]:
    return ["--speculative-model", draft, "--num-speculative-tokens", "3",
            "--spec-extend", spec_extend]


@contextlib.contextmanager
def serve(model: str, extra: list[str], log: Path, env: dict | None = None,
          max_model_len: int = MAX_MODEL_LEN):
    """``vllm serve`` with the CPU flags (and ``env`` added to ENV) until
    /health answers; yield the harness's ``Server`` (``base`` URL, ``log``). A
    server that does not start fails the test."""
    # No snapshot dir named: each server makes its own private one.
    env = {**{k: v for k, v in ENV.items() if k != METRICS_DIR_ENV}, **(env or {})}
    with contextlib.ExitStack() as stack:
        try:
            server = stack.enter_context(start_server(
                [model, *extra, *common(max_model_len)], log, STARTUP_S, env=env))
        except RuntimeError as e:
            pytest.fail(str(e))
        yield server


@pytest.fixture(scope="module")
def prompt(long_prompts) -> list[int]:
    return long_prompts(600)[0]


@pytest.fixture(scope="module")
def metrics_dir(tmp_path_factory) -> Path:
    """The shared server's snapshot directory, private as the plugin wants it
    (``test_metrics_dir_trouble_never_reaches_the_engine`` takes it away under
    the running server)."""
    directory = tmp_path_factory.mktemp("serve-metrics") / "metrics"
    directory.mkdir(mode=0o700)
    return directory


@pytest.fixture(scope="module")
def server(tiny_long_target, tiny_long_draft, metrics_dir, tmp_path_factory):
    """The SpecExtend server every test here that needs one shares."""
    log = tmp_path_factory.mktemp("serve") / "vllm_serve.log"
    # Logged requests: the log names each request the server aborts. All the
    # models' positions: room for a request that cannot end before its abort.
    positions = json.loads((Path(tiny_long_target) / "config.json").read_text())[
        "max_position_embeddings"]
    with serve(tiny_long_target,
               [*_spec_args(tiny_long_draft), "--enable-log-requests", *MIDDLEWARE],
               log, env={KEY_ENV: API_KEY, METRICS_DIR_ENV: str(metrics_dir)},
               max_model_len=positions) as spec_server:
        yield spec_server


@pytest.fixture(scope="module")
def plain_server(tiny_long_target, tmp_path_factory):
    """The same target without speculation: the greedy reference."""
    log = tmp_path_factory.mktemp("serve-plain") / "plain.log"
    with serve(tiny_long_target, [], log) as plain:
        yield plain


def _client(base: str):
    openai = pytest.importorskip("openai")
    # Servers without a key accept any.
    return openai.OpenAI(base_url=f"{base}/v1", api_key=API_KEY, timeout=300,
                         max_retries=0)


@pytest.fixture(scope="module")
def client(server):
    return _client(server.base)


def _complete(client, prompt, max_tokens: int, extra_body: dict | None = None, **kw):
    return client.completions.create(
        model=client.models.list().data[0].id, prompt=prompt, max_tokens=max_tokens,
        temperature=0, extra_body={"ignore_eos": True, **(extra_body or {})}, **kw)


IDLE = ("vllm:num_requests_running", "vllm:num_requests_waiting",
        "vllm:spec_extend_tracked_requests")


def _idle(metrics: dict[str, float]) -> bool:
    """No request in the engine and none holding SpecExtend state."""
    return all(metrics[key] == 0 for key in IDLE)


def test_completion_and_metrics(server, client, prompt):
    """A long greedy completion drafts through restricted views."""
    resp = _complete(client, prompt, 32)
    assert resp.usage.completion_tokens == 32
    assert resp.usage.prompt_tokens == len(prompt)
    assert resp.choices[0].finish_reason == "length"
    keys = ("vllm:spec_decode_num_draft_tokens_total",
            "vllm:spec_extend_retrievals_total", "vllm:spec_extend_view_rows_total")
    # The worker publishes its counters when the batch empties.
    m = wait_for(lambda: scrape(server.base),
                  lambda m: all(m.get(k, 0) > 0 for k in keys), f"{keys} > 0")
    draft = m["vllm:spec_extend_draft_context_tokens_total"]
    full = m["vllm:spec_extend_full_context_tokens_total"]
    assert 0 < draft < full
    # Labelled as vLLM's own spec-decode series: same model_name and engine.
    labels = _labels(server.base)
    assert labels["vllm:spec_extend_retrievals_total"] == \
        labels["vllm:spec_decode_num_draft_tokens_total"]
    assert set(labels["vllm:spec_extend_tracked_requests"]) == {"model_name", "engine"}


def _request(url: str, key: str | None = None,
             body: dict | None = None) -> tuple[int, bytes]:
    """The status and body of a GET (or, with ``body``, a JSON POST) to
    ``url``, with ``key`` as bearer token."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    request = urllib.request.Request(url, data=data, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=120) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


COMPLETION = {"prompt": "hello world", "max_tokens": 2, "temperature": 0}


@pytest.mark.parametrize("path, body", [
    ("/v1/models", None),
    ("/v1/completions", COMPLETION),
    # SageMaker's route runs the model; vLLM's own key check does not cover it.
    ("/invocations", COMPLETION),
    ("/tokenize", {"prompt": "hello world"}),
    ("/openapi.json", None),
], ids=lambda v: v if isinstance(v, str) else "")
def test_api_key_guards_every_path(server, path, body):
    """401 without the key, with a wrong one or one that only starts with it;
    200 with it. vLLM's own check (the same ``VLLM_API_KEY``) would leave
    ``/invocations``, ``/tokenize`` and ``/openapi.json`` open."""
    url = server.base + path
    for key in (None, "wrong-" + API_KEY, API_KEY + "x"):
        status, text = _request(url, key, body)
        assert status == 401, (path, key, status, text[:200])
    status, text = _request(url, API_KEY, body)
    assert status == 200, (path, status, text[:500])
    if body is COMPLETION:
        assert json.loads(text)["usage"]["completion_tokens"] == 2


@pytest.mark.parametrize("path", ["/health", "/metrics"])
def test_probe_paths_stay_open(server, path):
    """For probes and Prometheus, which send no key."""
    status, text = _request(server.base + path)
    assert status == 200, (path, status, text[:200])
    if path == "/metrics":
        assert b"vllm:" in text


def _labels(base: str) -> dict[str, dict[str, str]]:
    """``/metrics``: each series name with the labels of its first sample."""
    with urllib.request.urlopen(f"{base}/metrics", timeout=30) as r:
        text = r.read().decode()
    out = {}
    for match in re.finditer(r"^([\w:]+)\{([^}]*)\}", text, flags=re.M):
        pairs = re.findall(r'(\w+)="([^"]*)"', match.group(2))
        out.setdefault(match.group(1), dict(pairs))
    return out


def test_chat_completion(client, tiny_tokenizer, prompt):
    """Chat with a long user message hits the length limit with content."""
    text = tiny_tokenizer.decode(prompt)
    resp = client.chat.completions.create(
        model=client.models.list().data[0].id,
        messages=[{"role": "user", "content": text}],
        max_tokens=16, temperature=0, extra_body={"ignore_eos": True})
    assert resp.choices[0].message.content
    assert resp.choices[0].finish_reason == "length"
    assert resp.usage.completion_tokens == 16


def test_greedy_matches_plain_server(client, plain_server, prompt):
    """Greedy output with SpecExtend equals a server without speculation."""
    spec = _complete(client, prompt, 24).choices[0].text
    plain = _complete(_client(plain_server.base), prompt, 24).choices[0].text
    # The plugin is installed but not enabled: no SpecExtend series.
    exported = [k for k in scrape(plain_server.base)
                if k.startswith("vllm:spec_extend_")]
    assert spec == plain
    assert exported == []


def test_abort_leaves_no_state(server, client, prompt):
    """A stream closed while its request holds SpecExtend state: the server
    aborts that request, it does not finish, and its state is dropped."""
    # Nothing else in flight, so the gauges below are this request's alone.
    before = wait_for(lambda: scrape(server.base), _idle, "an idle server")
    # All the model length allows, 32168 tokens: on 2 loaded cores up to 2800
    # were generated before the close reached the server (the first chunk alone
    # came up to 9 s late), so the request is far from its end when aborted.
    max_tokens = client.models.list().data[0].max_model_len - len(prompt)
    stream = _complete(client, prompt, max_tokens, stream=True,
                       extra_body={"return_token_ids": True})
    received, reasons, tracked = 0, set(), False
    for chunk in stream:
        received += len(chunk.choices[0].token_ids)
        reasons.add(chunk.choices[0].finish_reason)
        # Close as soon as the worker has published the request's state.
        if scrape(server.base)["vllm:spec_extend_tracked_requests"] >= 1:
            tracked = True
            break
    stream.close()
    assert tracked, f"the stream ended before the request was tracked: {reasons}"
    assert reasons == {None} and 0 < received < max_tokens

    # The request leaves the engine and its state goes, with no request of ours.
    after = wait_for(lambda: scrape(server.base), _idle, "the request's end")
    # It ended unfinished: a finished request (any reason) counts as a success.
    assert after["vllm:request_success_total"] == before["vllm:request_success_total"]
    # And the server names it aborted (vLLM's engine id: the response id, "-0").
    line = f"Request {chunk.id}-0 aborted."
    wait_for(lambda: server.log.read_text(errors="replace"),
              lambda log: line in log, f"{line!r} in the server log")


def test_metrics_dir_trouble_never_reaches_the_engine(server, client, plain_server,
                                                     metrics_dir, prompt):
    """The snapshot directory removed, then replaced by a file, under the
    running server: it keeps answering, token-identical to plain decoding; the
    worker makes the directory again and /metrics recovers; while it is
    refused the series are left out; each process warns once, not per step.
    (The last test of the shared server: its directory is given back after.)"""
    plain = _complete(_client(plain_server.base), prompt, 24).choices[0].text
    directory, log = metrics_dir, server.log
    retrievals = "vllm:spec_extend_retrievals_total"
    try:
        shutil.rmtree(directory)
        assert _complete(client, prompt, 24).choices[0].text == plain
        # The worker publishes (and makes the directory again) at the latest
        # when the batch empties; the earlier tests' counts left with the
        # directory's snapshots.
        m = wait_for(lambda: scrape(server.base),
                      lambda m: m.get(retrievals, 0) > 0, "/metrics recovered")
        assert stat.S_IMODE(directory.stat().st_mode) == 0o700
        shutil.rmtree(directory)
        directory.write_text("")  # cannot be made again: not a directory
        assert _complete(client, prompt, 24).choices[0].text == plain

        def refused(_) -> bool:  # by the API server's scrape and the worker
            return log.read_text().count("is not a directory") >= 2

        m = wait_for(lambda: scrape(server.base), refused,
                      "the worker's and the API server's refusals")
        assert not [k for k in m if k.startswith("vllm:spec_extend_")]
        warnings = [line for line in log.read_text().splitlines()
                    if "SpecExtend metrics:" in line and str(directory) in line]
    finally:
        if directory.is_file():
            directory.unlink()  # the worker makes the directory again
    # One per process and trouble, though every report failed: the worker's
    # "made again" and "refused", the API server's "refused".
    assert len(warnings) == 3, warnings
    assert sum("was missing" in w for w in warnings) == 1, warnings


def _bad_args(case: str, draft: str) -> list[str]:
    if case == "no-draft":
        return ["--spec-extend", "{}"]
    if case == "ngram":
        return ["--spec-extend", "--speculative-config", '{"method": "ngram", '
                '"num_speculative_tokens": 3, "prompt_lookup_max": 3}']
    return _spec_args(draft, {
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


def _vllm(argv, listen: bool = True, env: dict | None = None, timeout_s: float = 180):
    """The starter of a background job (``background.py``): ``vllm ARGV``
    (``argv(fixture)``) to its end, output captured; ``env`` added to ENV;
    ``listen``: on a free port. On a timeout it is stopped with its whole
    process group (an engine a wrongly started server spawned too), not alone."""
    def start(fixture):
        args = [*vllm_command(), *argv(fixture)]
        snapshots = fixture("tmp_path_factory").mktemp("cli")
        full_env = {**ENV, METRICS_DIR_ENV: str(snapshots), **(env or {})}

        def job():
            # Picked when it runs: a port picked at the session's start could
            # be taken by then.
            port = ["--host", "127.0.0.1", "--port", str(free_port())] if listen else []
            return background.run([*args, *port], timeout=timeout_s, env=full_env,
                                  stdin=subprocess.DEVNULL)
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
    "help": _vllm(lambda _: ["serve", "--help"], listen=False),
    "help-section": _vllm(lambda _: ["serve", "--help=SpecExtend"], listen=False),
}


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


def test_help_shows_the_spec_extend_group(request):
    """``vllm serve --help`` lists the group with its flags; ``--help=SpecExtend``
    shows the flags' help."""
    plain = background.result(request, "help")
    assert plain.returncode == 0, plain.stderr[-3000:]
    group = [line for line in plain.stdout.splitlines()
             if line.strip().startswith("SpecExtend ")]
    assert len(group) == 1, plain.stdout[-3000:]
    assert "--spec-extend" in group[0] and "--speculative-model" in group[0]
    section = background.result(request, "help-section")
    assert section.returncode == 0, section.stderr[-3000:]
    assert "No group or arguments matching" not in section.stdout
    for flag in ("--spec-extend", "--speculative-model", "--num-speculative-tokens"):
        assert flag in section.stdout, section.stdout[-3000:]
