"""End-to-end ``vllm serve --spec-extend`` on CPU: OpenAI API, /metrics, aborts,
greedy equivalence with plain decoding, and the API key every deployment sets
(``deploy/README.md``): the shared server runs with ``VLLM_API_KEY`` and
``--middleware vllm_specextend.auth.ApiKeyMiddleware`` as the deployments start
it. One server, shared by the module's tests; the greedy reference is plain
decoding in this process with the server's CPU settings (``cpu_engine``; a
plain server took 46-135 s of CI to start). That a server without
``--spec-extend`` exports no SpecExtend series: ``test_bench_serve.py``, whose
plain server the benchmark starts anyway. ``vllm serve``'s command line
(errors at startup, help): ``test_serve_cli.py``."""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import stat
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from cpu_serve import ENV, MAX_MODEL_LEN, MIDDLEWARE, STARTUP_S, common, spec_args
from waiting import wait_for

from benchmarks.harness.server import scrape
from benchmarks.harness.server import serve as start_server
from vllm_specextend.serving.auth import KEY_ENV
from vllm_specextend.serving.snapshots import METRICS_DIR_ENV

pytestmark = pytest.mark.server

# The shared server requires it, as the deployments do (VLLM_API_KEY): long
# enough for the middleware's floor (auth.MIN_KEY_CHARS).
API_KEY = "test-key-" + "k" * 32
PLAIN_TOKENS = 24  # the greedy comparisons' answer length


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
               [*spec_args(tiny_long_draft), "--enable-log-requests", *MIDDLEWARE],
               log, env={KEY_ENV: API_KEY, METRICS_DIR_ENV: str(metrics_dir)},
               max_model_len=positions) as spec_server:
        yield spec_server


@pytest.fixture(scope="module")
def plain_tokens(tiny_long_target, prompt) -> list[int]:
    """Plain greedy decoding of ``prompt`` (in-process, fp32, the server's
    block size and seed): what the server must answer, token for token."""
    from cpu_engine import plain_reference

    return plain_reference(tiny_long_target, [prompt], PLAIN_TOKENS)[0]


def _client(base: str):
    openai = pytest.importorskip("openai")
    # The shared server wants the key (VLLM_API_KEY), as the deployments do.
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


def _tokens(client, prompt) -> list[int]:
    """The server's greedy answer to ``prompt``, as token ids."""
    resp = _complete(client, prompt, PLAIN_TOKENS, {"return_token_ids": True})
    return list(resp.choices[0].token_ids)


def test_greedy_matches_plain_decoding(client, plain_tokens, prompt):
    """Greedy output with SpecExtend equals plain decoding's."""
    assert _tokens(client, prompt) == plain_tokens


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


def test_metrics_dir_trouble_never_reaches_the_engine(server, client, plain_tokens,
                                                     metrics_dir, prompt):
    """The snapshot directory removed, then replaced by a file, under the
    running server: it keeps answering, token-identical to plain decoding; the
    worker makes the directory again and /metrics recovers; while it is
    refused the series are left out; each process warns once, not per step.
    (The last test of the shared server: its directory is given back after.)"""
    directory, log = metrics_dir, server.log
    retrievals = "vllm:spec_extend_retrievals_total"
    try:
        shutil.rmtree(directory)
        assert _tokens(client, prompt) == plain_tokens
        # The worker publishes (and makes the directory again) at the latest
        # when the batch empties; the earlier tests' counts left with the
        # directory's snapshots.
        m = wait_for(lambda: scrape(server.base),
                      lambda m: m.get(retrievals, 0) > 0, "/metrics recovered")
        assert stat.S_IMODE(directory.stat().st_mode) == 0o700
        shutil.rmtree(directory)
        directory.write_text("")  # cannot be made again: not a directory
        assert _tokens(client, prompt) == plain_tokens

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
