#!/bin/bash
# The grid's loop (host.sh grid starts it detached): one run.py per mode, one
# after another, into DIR/<mode>_k<K>.json and .log; with --profile, one
# profile.py a mode instead (CELL: one group:context), into DIR/profile_*.json.
# The suffix mode alone has arctic-inference on its path (ARCTIC_DIR, host.sh
# build installs it into /root/arctic); a mode that fails prints its log's
# last line and the grid goes on. ENGINE_ARGS (JSON), where set, goes to every
# mode as --engine-args: '{"load_format": "dummy"}' profiles the pair's shapes
# with random weights (speed only: no acceptance, no claim on real work).
# MODE[:K]@CELL,CELL runs that mode over its own cells instead of the grid's
# (a lever that only one cell asks about, without a pass over the rest).
#   bash benchmarks/realpair/grid.sh [--profile] DIR CASES TARGET DRAFT \
#        "MODE[:K][@CELL,..] ..." "CELL ..."
set -uo pipefail
profile=0
[ "${1:-}" = --profile ] && { profile=1; shift; }
dir=$1 cases=$2 target=$3 draft=$4 modes=$5 cells=$6
mkdir -p "$dir"
# MODE[:K][@CELLS] -> mode, k (4 where none is named) and name, its files'.
split_mode() {
  local m=${1%%@*}
  mode=${m%%:*} k=4
  [ "$mode" != "$m" ] && k=${m#*:}
  name=${mode}_k$k
}
# One file a MODE:K: the same one twice (cells or not) would overwrite it.
twice=$(for m in $modes; do split_mode "$m"; echo "$name"; done | sort | uniq -d \
  | head -n 1)
if [ -n "$twice" ]; then
  echo "grid.sh: $twice named twice: its files would overwrite each other" >&2
  exit 2
fi
for m in $modes; do
  split_mode "$m"
  mode_cells=$cells
  [ "${m#*@}" != "$m" ] && mode_cells=${m#*@} && mode_cells=${mode_cells//,/ }
  echo "== $name $(date +%T)"
  # The script and its own arguments; the mode's are the same for both.
  if [ $profile = 1 ]; then
    own=(profile --cell "$mode_cells" --out-dir "$dir")
  else
    # shellcheck disable=SC2206  # cells: one word each
    own=(run --cells $mode_cells --out "$dir/$name.json")
  fi
  path=${PYTHONPATH:-}
  [ "$mode" = suffix ] && path=${path:+$path:}${ARCTIC_DIR:-/root/arctic}
  PYTHONPATH=$path timeout 900 python3 -m "benchmarks.realpair.${own[0]}" --cases "$cases" \
    --target "$target" --draft "$draft" --mode "$mode" --k "$k" "${own[@]:1}" \
    ${ENGINE_ARGS:+--engine-args "$ENGINE_ARGS"} > "$dir/$name.log" 2>&1
  rc=$?
  echo "rc=$rc $(date +%T)"
  # No process may hold the GPU when the next engine starts (vLLM's start-up
  # memory check would refuse it).
  for _ in $(seq 60); do
    [ -z "$(nvidia-smi --query-compute-apps=pid --format=csv,noheader)" ] && break
    sleep 1
  done
  grep -E "^$mode k=" "$dir/$name.log"
  grep -m3 -E 'Error|Traceback' "$dir/$name.log"
  [ $rc = 0 ] || tail -n 1 "$dir/$name.log"
done
echo done
