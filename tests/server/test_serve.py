"""End-to-end ``vllm serve --spec-extend`` on CPU: OpenAI API, /metrics, aborts,
greedy equivalence with a plain server and startup errors for bad configs."""

from __future__ import annotations

import contextlib
import subprocess
import time
from pathlib import Path

import pytest
from cpu_serve import COMMON, ENV, SPEC_EXTEND, STARTUP_S

from benchmarks.harness.server import free_port, scrape, vllm_command
from benchmarks.harness.server import serve as start_server
from vllm_specextend.metrics import METRICS_DIR_ENV

pytestmark = pytest.mark.server


def _spec_args(draft: str, spec_extend: str = SPEC_EXTEND) -> list[str]:
    return ["--speculative-model", draft, "--num-speculative-tokens", "3",
            "--spec-extend", spec_extend]


@contextlib.contextmanager
def serve(model: str, extra: list[str], log: Path):
    """``vllm serve`` with the CPU flags until /health answers; yield its URL.
    A server that does not start fails the test."""
    # A fresh snapshot dir: stale worker files elsewhere must not leak in.
    metrics = log.parent / f"metrics-{log.stem}"
    metrics.mkdir()
    with contextlib.ExitStack() as stack:
        try:
            server = stack.enter_context(start_server(
                [model, *extra, *COMMON], log, STARTUP_S,
                env={**ENV, METRICS_DIR_ENV: str(metrics)}))
        except RuntimeError as e:
            pytest.fail(str(e))
        yield server.base


@pytest.fixture(scope="module")
def prompt(long_prompts) -> list[int]:
    return long_prompts(600)[0]


@pytest.fixture(scope="module")
def server(tiny_target, tiny_draft, tmp_path_factory):
    log = tmp_path_factory.mktemp("serve") / "vllm_serve.log"
    with serve(tiny_target, _spec_args(tiny_draft), log) as base:
        yield base


@pytest.fixture(scope="module")
def client(server):
    openai = pytest.importorskip("openai")
    return openai.OpenAI(base_url=f"{server}/v1", api_key="x", timeout=300,
                         max_retries=0)


def _complete(client, prompt, max_tokens: int, **kw):
    return client.completions.create(
        model=client.models.list().data[0].id, prompt=prompt,
        max_tokens=max_tokens, temperature=0, extra_body={"ignore_eos": True}, **kw)


def _poll_metrics(base, client, prompt, done, timeout_s: float = 30.0):
    """Scrape until ``done(metrics)``; between tries send a request after the
    stats interval, so the worker writes a fresh snapshot."""
    deadline = time.monotonic() + timeout_s
    while True:
        metrics = scrape(base)
        if done(metrics) or time.monotonic() > deadline:
            return metrics
        time.sleep(1.2)
        _complete(client, prompt, 4)


def test_completion_and_metrics(server, client, prompt):
    """A long greedy completion drafts through restricted views."""
    resp = _complete(client, prompt, 32)
    assert resp.usage.completion_tokens == 32
    assert resp.usage.prompt_tokens == len(prompt)
    assert resp.choices[0].finish_reason == "length"
    keys = ("vllm:spec_decode_num_draft_tokens_total",
            "vllm:spec_extend_retrievals_total", "vllm:spec_extend_view_rows_total")
    m = _poll_metrics(server, client, prompt,
                      lambda m: all(m.get(k, 0) > 0 for k in keys))
    for key in keys:
        assert m.get(key, 0) > 0, (key, m)
    draft = m["vllm:spec_extend_draft_context_tokens_total"]
    full = m["vllm:spec_extend_full_context_tokens_total"]
    assert 0 < draft < full


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


def test_greedy_matches_plain_server(client, tiny_target, prompt, tmp_path):
    """Greedy output with SpecExtend equals a server without speculation."""
    from openai import OpenAI

    spec = _complete(client, prompt, 24).choices[0].text
    with serve(tiny_target, [], tmp_path / "plain.log") as base:
        plain_client = OpenAI(base_url=f"{base}/v1", api_key="x", timeout=300,
                              max_retries=0)
        plain = _complete(plain_client, prompt, 24).choices[0].text
    assert spec == plain


def test_abort_leaves_no_state(server, client, prompt):
    """A stream closed mid-way drops the request's SpecExtend state."""
    generated = scrape(server)["vllm:generation_tokens_total"]
    stream = _complete(client, prompt, 400, stream=True)
    start, chunks = time.monotonic(), 0
    for _ in stream:
        chunks += 1
        if chunks >= 5 and time.monotonic() - start > 2.5:
            break
    # Drafting for >1 interval: the worker published the live request.
    assert scrape(server)["vllm:spec_extend_tracked_requests"] >= 1
    stream.close()
    short = prompt[:32]  # below min_context: never tracked itself
    m = _poll_metrics(server, client, short,
                      lambda m: m["vllm:spec_extend_tracked_requests"] == 0)
    assert m["vllm:spec_extend_tracked_requests"] == 0
    # The aborted request stopped early, so it was dropped, not finished.
    assert m["vllm:generation_tokens_total"] - generated < 400


@pytest.mark.parametrize("spec_extend, draft, message", [
    ('{"bogus": 1}', True, "Unknown spec_extend key"),
    ('{"top_k": 0}', True, "spec_extend.top_k=0 must be"),
    ("{}", False, "needs a draft model"),
    ('{"chunk_size": 48, "sink_tokens": 0}', True, "multiple of the KV block size"),
    ("not json", True, "expects a JSON object"),
], ids=["unknown-key", "top-k", "no-draft", "chunk-vs-block", "not-json"])
def test_bad_config_fails_at_startup(tiny_target, tiny_draft, tmp_path,
                                     spec_extend, draft, message):
    """Bad --spec-extend setups stop ``vllm serve`` with our message."""
    args = (_spec_args(tiny_draft, spec_extend) if draft
            else ["--spec-extend", spec_extend])
    proc = subprocess.run([*vllm_command(), "serve", tiny_target, *args, *COMMON,
                           "--host", "127.0.0.1", "--port", str(free_port())],
                          capture_output=True, text=True, timeout=180,
                          env={**ENV, METRICS_DIR_ENV: str(tmp_path)},
                          stdin=subprocess.DEVNULL, start_new_session=True)
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0, output[-3000:]
    assert message in output, output[-3000:]
