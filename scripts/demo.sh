#!/usr/bin/env bash
# The one-command CPU demo: venv, model, `vllm serve --spec-extend`, one long
# request, metrics, stop. Offline apart from PyPI during the first setup.
#
#   bash scripts/demo.sh [demo.py options]      # e.g. --max-tokens 64
#
# Environment:
#   SPECEXTEND_VENV         venv (default: ~/.cache/vllm-specextend/venv-cpu)
#   SPECEXTEND_MODELS       model cache (default: ~/.cache/vllm-specextend/models)
#   SPECEXTEND_DEMO_MODEL   serve this model directory instead of building
#                           SmolLM2-135M-Instruct (used as target and draft)
set -euo pipefail

# Bytecode beside the sources (the venv's own), as .ci/run does.
unset PYTHONPYCACHEPREFIX PYTHONDONTWRITEBYTECODE

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"
start=$SECONDS

VENV="$(bash "$ROOT/scripts/setup_cpu.sh")"
# Intel OpenMP for vLLM's CPU engine, as it asks for (docs/cpu.md).
export LD_PRELOAD="$VENV/lib/libiomp5.so${LD_PRELOAD:+:$LD_PRELOAD}"

MODEL="${SPECEXTEND_DEMO_MODEL:-}"
if [ -z "$MODEL" ]; then
  MODEL="${SPECEXTEND_MODELS:-$HOME/.cache/vllm-specextend/models}/smollm2-135m-instruct"
  echo "[demo] building SmolLM2-135M-Instruct in $MODEL (skipped if present)"
  PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" "$VENV/bin/python" -m benchmarks.models.builders smollm2 "$MODEL" \
    >/dev/null
fi

rc=0
# The repository on PYTHONPATH: demo.py uses the benchmarks package.
PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" "$VENV/bin/python" "$ROOT/scripts/demo.py" --model "$MODEL" \
  --venv-bin "$VENV/bin" "$@" || rc=$?
echo "[demo] total $((SECONDS - start)) s, exit $rc"
exit "$rc"
