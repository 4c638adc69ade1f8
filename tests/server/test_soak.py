"""``python -m benchmarks.serve.soak`` on CPU for a minute: every pass criterion of
the soak holds for the tiny models (a few clients, short prompts, aborts,
malformed requests, a KV cache that makes vLLM preempt), so a regression of
any of them fails CI. The GPU soak is ``host_run.sh soak21``.

The probes' plain reference comes from an in-process plain engine (greedy,
fp32: the tokens a plain server gives), not from a second server: that start
would double the test's time.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import background
import pytest
from cpu_serve import ENV, SPEC_EXTEND, common

from benchmarks.serve import soak
from vllm_specextend.serving.snapshots import METRICS_DIR_ENV

pytestmark = pytest.mark.server

REPO_ROOT = Path(__file__).resolve().parents[2]
DURATION_S = 60
MAX_MODEL_LEN = 2048
CLIENTS, MIN_INPUT_LEN, MAX_INPUT_LEN, MAX_OUTPUT_LEN = 6, 128, 1536, 48
# The target drafts for itself (drafts get accepted): 2 + 2 layers of 512 B of
# fp32 KV per token, so 4 MiB holds 2048 tokens, the one request of
# max_model_len vLLM asks room for. The clients' requests, ~600 tokens on
# average (log-uniform lengths), want ~3.8K: vLLM preempts.
KV_CACHE = "4M"
PROBE_LENS = [128, 256, 384, 512, 768, 1024, 1280, 1536]
PROBE_OUTPUT_LEN = 24
RUN_TIMEOUT_S = 1200
"""Bounds a hung run: two server starts of up to 5 min each, the minute of
load, and the drain."""


def _soak_job(fixture):
    """One soak run (``background.py``): the plain reference here, the run in
    the background (``long_prompts``: skips without the data)."""
    fixture("long_prompts")
    tiny_target = fixture("tiny_target")
    out = fixture("tmp_path_factory").mktemp("soak")
    probes = soak.probe_prompts(fixture("tiny_tokenizer"), PROBE_LENS)
    # Imported here: cpu_engine makes this process's engines in-process
    # (VLLM_ENABLE_V1_MULTIPROCESSING=0), which must not reach cpu_serve.ENV,
    # the soak servers' environment, where this module imports cpu_serve
    # first (a run of this file alone).
    from cpu_engine import ENGINE_MAX_MODEL_LEN, plain_reference

    assert ENGINE_MAX_MODEL_LEN == MAX_MODEL_LEN, "the reference's and the server's"
    tokens = plain_reference(tiny_target, probes, PROBE_OUTPUT_LEN)
    reference = out / "reference.json"
    soak.write_reference(reference, probes, PROBE_OUTPUT_LEN, tokens,
                         "an in-process plain engine (tests/cpu_engine.py)")
    cmd = [sys.executable, "-m", "benchmarks.serve.soak", "--target", tiny_target,
           "--draft", tiny_target, "--duration-s", str(DURATION_S),
           "--concurrency", str(CLIENTS), "--min-input-len", str(MIN_INPUT_LEN),
           "--max-input-len", str(MAX_INPUT_LEN), "--max-output-len",
           str(MAX_OUTPUT_LEN), "--abort-max-delay-s", "2",
           "--probe-lens", *map(str, PROBE_LENS),
           "--probe-output-len", str(PROBE_OUTPUT_LEN), "--num-spec-tokens", "3",
           "--spec-extend", SPEC_EXTEND, "--reference", str(reference),
           "--startup-timeout-s", "300", "--request-timeout-s", "300",
           "--idle-timeout-s", "120", "--out-dir", str(out / "results"),
           "--", *common(MAX_MODEL_LEN, KV_CACHE)]
    # No snapshot dir named: the server makes its own private one.
    env = {k: v for k, v in ENV.items() if k != METRICS_DIR_ENV}
    return lambda: (background.run(cmd, timeout=RUN_TIMEOUT_S, env=env, cwd=REPO_ROOT,
                                   stdin=subprocess.DEVNULL), out)


BACKGROUND = {"soak": _soak_job}


@pytest.fixture(scope="module")
def result(request):
    """One soak run's result file."""
    proc, out = background.result(request, "soak")
    files = sorted((out / "results").glob("*_cpu.json"))
    why = proc.stdout[-3000:] + proc.stderr[-3000:]
    assert len(files) == 1, why
    res = json.loads(files[0].read_text())
    # A run cut short writes what it finished: say why it stopped.
    assert "criteria" in res, why
    return proc, res


def test_every_criterion_passes(result):
    proc, res = result
    criteria = res["criteria"]
    assert set(criteria) == {
        "no_engine_death", "no_5xx", "malformed_answered", "requests_complete",
        "idle_at_end", "preempted", "probes_stable", "probes_match_plain"}
    failed = {k: c["detail"] for k, c in criteria.items() if c["pass"] is not True}
    assert not failed, proc.stdout[-2000:]
    assert res["pass"] and proc.returncode == 0


def test_the_load_was_what_it_claims(result):
    """Each kind of request went out, aborts were closed by their clients,
    every malformed case was answered with its status and a message, the
    plugin held state under the load, and the server stopped cleanly."""
    _, res = result
    traffic = res["traffic"]
    assert {"complete", "stream", "chat", "abort", "malformed"} <= set(traffic["sent"])
    closed = sum(n for k, n in traffic["outcomes"].items()
                 if k.startswith("abort:closed_"))
    assert closed > 0
    for name, case in traffic["malformed"].items():
        if case["expect"] >= 400:
            assert all(case["messages"]), name
    peaks = res["watch"]["gauge_peaks"]
    assert peaks["vllm:spec_extend_tracked_requests"] > 0
    assert peaks["vllm:spec_extend_request_slots"] > 0
    assert res["counters"]["vllm:spec_extend_retrievals_total"] > 0
    assert res["spec_server"]["forced_stop"] == []
