#!/bin/bash
# On the offline GPU host, after ../shared/gpu/host-setup.sh has installed vLLM
# into /root/vsite: install this plugin (and pytest) from carried wheels, then
# run one phase, writing results and logs under $OUT. Run from the repository
# root: the tools run as modules of the benchmarks package, by job
# (python3 -m benchmarks.JOB.TOOL, e.g. benchmarks.decode.bench_decode).
#
#   bash benchmarks/gpu/host_run.sh PHASE
#
# A phase is a file of its own, benchmarks/gpu/phases/PHASE.sh, whose header
# says what it measures and what it feeds (an issue, files under
# benchmarks/results); phases/common.sh holds the helpers several share.
# This script checks PHASE against those files (an unknown one stops here,
# before the install, and lists them), sets up the host, sources
# common.sh, then sources the phase: it runs in this shell, so its `exit`
# ends the call, its status is the call's, and $0 is still this script
# (rate45 runs serve12 as `bash "$0" serve12`).
set -uo pipefail
PHASES=benchmarks/gpu/phases
phase_names() {
  local f
  for f in "$PHASES"/*.sh; do f=${f##*/}; [ "$f" = common.sh ] || echo "${f%.sh}"; done
}
phase_known() {
  local p
  for p in $(phase_names); do [ "$p" = "$1" ] && return 0; done
  return 1
}
if ! phase_known "${1:-}"; then
  [ -n "${1:-}" ] && echo "host_run.sh: no phase named '$1'" >&2
  echo "usage: host_run.sh PHASE, one of:" $(phase_names) >&2
  exit 2
fi
# The repository's sources come first: the wheel supplies the plugin's entry
# point, the checkout that travelled with this call supplies its code.
export PYTHONPATH=$PWD:/root/vsite PYTHONUNBUFFERED=1 SPECEXTEND_DATA_DIR=$PWD/.gpu/data
# The tree prepare.sh packed (benchmarks/harness/meta.py: git_commit),
# "-stale" where this call's code is not that tree's (benchmarks/gpu/tree.sh).
if [ -f .gpu/wheel/COMMIT ]; then
  source benchmarks/gpu/tree.sh
  read -r packed packed_hash < .gpu/wheel/COMMIT
  [ "$(tree_hash)" = "${packed_hash:-}" ] || packed=$packed-stale
  export SPECEXTEND_COMMIT=$packed
fi
OUT=${OUT:-/tmp/out}
M=.gpu/models
# HOST_RUN_INSTALLED=1: a phase run by another (rate45) skips the reinstall,
# which could race a server starting beside it; not where the plugin was never
# installed (a fresh host: `vllm serve` then refuses --spec-extend; 2026-11-29).
if [ "${HOST_RUN_INSTALLED:-0}" != 1 ] || ! ls -d /root/vsite/vllm_specextend-*.dist-info >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --upgrade \
    --target /root/vsite .gpu/wheel/*.whl 2>&1 | grep -v WARNING
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT/gpu.txt"
source benchmarks/gpu/detached.sh
source "$PHASES/common.sh"
source "$PHASES/$1.sh"
