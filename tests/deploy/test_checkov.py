"""checkov, an infrastructure-as-code security linter, passes on the Kubernetes
manifests (``deploy/k8s/``) and the Dockerfile (``docker/``), with every
skipped check explained where it is declared (``test_manifests.py`` checks
the reasons). checkov has no compose framework; ``test_manifests.test_compose``
checks the compose file's security settings.

checkov pins older ``packaging``, ``networkx``, ``cachetools`` and
``python-dateutil`` than vLLM 0.26, so it does not go into the test venv: it
runs in an isolated environment that ``uv tool run`` builds once and caches
(checkov 3.3.30 with 96 packages: about 15 s the first time, then a second;
uv's cache, ``~/.cache/uv``). ``--skip-download`` keeps it off Prisma Cloud's
servers.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import background
import pytest

REPO = Path(__file__).resolve().parents[2]
CHECKOV = "checkov==3.3.30"
# uv comes with the test venv (scripts/setup_cpu.sh installs it there).
UV = [sys.executable, "-m", "uv"]


def _checkov(*args: str, cwd: Path = REPO):
    """A background job (``background.py``): checkov on ARGS, beside the rest
    of the suite (a run takes 15-20 s of a core, most of it Python starting)."""
    cmd = [*UV, "tool", "run", "--from", CHECKOV, "checkov", "--skip-download",
           "--output", "json", *args]
    return lambda: background.run(cmd, timeout=600, cwd=cwd, stdin=subprocess.DEVNULL)


def _root_pod(fixture):
    """checkov on a privileged root pod, written at the session's start."""
    directory = fixture("tmp_path_factory").mktemp("checkov")
    (directory / "pod.yaml").write_text(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: p\n  namespace: n\n"
        "spec:\n  containers:\n    - name: c\n      image: busybox:1.36\n"
        "      securityContext:\n        privileged: true\n")
    return _checkov("-d", str(directory), cwd=directory)


BACKGROUND = {"manifests": lambda fixture: _checkov("-d", "deploy/k8s", "-d", "docker"),
              "root-pod": _root_pod}


def _result(request, name: str) -> subprocess.CompletedProcess:
    try:
        return background.result(request, name)
    except FileNotFoundError:
        pytest.skip("uv is not installed in this venv (scripts/setup_cpu.sh)")


def _reports(result: subprocess.CompletedProcess) -> list[dict]:
    """Every framework's report: checkov prints one JSON value (a report or a
    list of them) per scanned directory."""
    decoder, text, reports, i = json.JSONDecoder(), result.stdout, [], 0
    while (i := _skip_space(text, i)) < len(text):
        value, i = decoder.raw_decode(text, i)
        reports += value if isinstance(value, list) else [value]
    return reports


def _skip_space(text: str, i: int) -> int:
    while i < len(text) and text[i].isspace():
        i += 1
    return i


def test_manifests_and_dockerfile_pass(request):
    result = _result(request, "manifests")
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    reports = _reports(result)
    assert {"kubernetes", "dockerfile"} <= {r["check_type"] for r in reports}
    # Every manifest was parsed and checked (a YAML error makes checkov skip a
    # file silently), the Deployment above all.
    checked = {c["resource"].split(".")[0] for r in reports
               if r["check_type"] == "kubernetes"
               for c in r["results"]["passed_checks"]}
    assert {"Deployment", "Service", "ConfigMap"} <= checked
    skipped = {c["check_id"] for r in reports for c in r["results"]["skipped_checks"]}
    assert skipped == {"CKV_K8S_43", "CKV_K8S_35"}, skipped


def test_checkov_fails_on_a_root_container(request):
    """The linter runs and fails on findings: a privileged root pod."""
    result = _result(request, "root-pod")
    assert result.returncode == 1
    failed = {c["check_id"] for r in _reports(result)
              for c in r["results"]["failed_checks"]}
    assert {"CKV_K8S_16", "CKV_K8S_23"} <= failed  # privileged, root
