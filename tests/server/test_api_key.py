"""``vllm serve`` with an API key, as the deployments start it (CPU): vLLM's own
check (``VLLM_API_KEY``) plus ``--middleware deploy.auth.ApiKeyMiddleware``.

Without the key every path answers 401, ``/invocations`` included (vLLM's own
check leaves it open: ``tests/deploy/test_auth.py``); with it, 200. ``/health``
and ``/metrics`` answer without a key, for probes and Prometheus.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from cpu_serve import ENV, STARTUP_S, common

from benchmarks.harness.server import serve
from deploy.auth import KEY_ENV
from vllm_specextend.metrics import METRICS_DIR_ENV

pytestmark = pytest.mark.server

KEY = "k" * 40  # a test key: long enough for the middleware's floor
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def server(tiny_target, tmp_path_factory):
    log = tmp_path_factory.mktemp("api_key") / "vllm_serve.log"
    # The server imports deploy.auth: the repository root on its path.
    path = os.pathsep.join(p for p in (str(REPO), ENV.get("PYTHONPATH")) if p)
    env = {**{k: v for k, v in ENV.items() if k != METRICS_DIR_ENV},
           KEY_ENV: KEY, "PYTHONPATH": path}
    args = [tiny_target, *common(), "--middleware", "deploy.auth.ApiKeyMiddleware"]
    try:
        with serve(args, log, STARTUP_S, env=env) as s:
            yield s
    except RuntimeError as e:  # did not start: the log's tail says why
        pytest.fail(str(e))


def _request(base: str, path: str, key: str | None = None,
             body: dict | None = None) -> tuple[int, bytes]:
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(base + path, data=data, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
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
def test_key_required(server, path, body):
    for key in (None, "wrong-" + KEY, KEY + "x"):
        status, text = _request(server.base, path, key, body)
        assert status == 401, (path, key, status, text[:200])
    status, text = _request(server.base, path, KEY, body)
    assert status == 200, (path, status, text[:500])
    if "completions" in path or path == "/invocations":
        assert json.loads(text)["usage"]["completion_tokens"] == 2


@pytest.mark.parametrize("path", ["/health", "/metrics"])
def test_probe_paths_stay_open(server, path):
    status, text = _request(server.base, path)
    assert status == 200, (path, status, text[:200])
    if path == "/metrics":
        assert b"vllm:" in text
