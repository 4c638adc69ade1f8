# What several of host_run.sh's phases share, sourced by it before the phase
# (not a phase itself): stop_leftovers, side_by_side, smollm2_target,
# configs_side_by_side, the TP_FUSION check and tp_flags. A phase's own
# helper stays in its file (serve12.sh: serve_traffic).
#
# A call cut short by its own timeout leaves what ran under `timeout`, which
# puts its command in a process group of its own: the bench and its server go
# on, and the next server fails on memory (seen 2026-11-25). Stop the bench
# first (its SIGTERM handler stops its server's group), then any vLLM process
# left, and wait until no process holds the GPU. The patterns are anchored at
# the start of a command line, so the shell that runs this never matches; a
# detached run (a soak, a long serving table: detached.sh) is left alone.
# Phases side by side on one host, each on its GPUs (CUDA_VISIBLE_DEVICES):
# SIDE_BY_SIDE=1 in every one but the first keeps this from killing the
# others' engines (2026-11-28: three phases on a 4-GPU host; the first one
# started alone). Tar the logs: a call brings back at most 8 files.
stop_leftovers() {
  [ "${SIDE_BY_SIDE:-0}" = 1 ] && return 0
  local bench='^python3 -m benchmarks\.serve\.(bench_serve|soak) '
  local vllm='^[^ ]*python[0-9.]* -m vllm\.entrypoints\.cli\.main serve |^[^ ]*/vllm serve |^VLLM::'
  local running
  if running=$(detached_running); then
    echo "a detached run is going ($running): its servers are left alone" >&2; return 1
  fi
  if pkill -TERM -f "$bench"; then
    echo "stopping a bench an earlier call left running"
    for _ in $(seq 90); do pgrep -f "$bench" > /dev/null || break; sleep 1; done
    pkill -KILL -f "$bench"
  fi
  pkill -KILL -f "$vllm" && echo "killed vLLM processes an earlier call left running"
  for _ in $(seq 60); do
    [ -z "$(nvidia-smi --query-compute-apps=pid --format=csv,noheader)" ] && return 0
    sleep 1
  done
  echo "the GPU is still in use after stopping the leftovers:" >&2
  nvidia-smi --query-compute-apps=pid,process_name --format=csv,noheader >&2
  return 1
}
# Evaluations side by side, one process per dataset (and per length where
# LENGTHS names any): at batch 1 a 135M model leaves the GPU mostly idle, so
# several cost about the wall time of one. Accepted lengths and outputs do
# not depend on it; tok/s columns are then no speed results. Each engine
# reserves its KV cache by size (--kv-cache-memory-bytes), which skips vLLM's
# start-up memory profiling that another process's frees could upset.
#   side_by_side TAG "DATASETS" "" ARGS...        ->  $OUT/TAG_<dataset>.{json,md,log}
#   side_by_side TAG "DATASETS" "LENGTHS" ARGS... ->  $OUT/TAG_<length>_<dataset>.{json,md,log}
# More than two processes' files go into $OUT/TAG.tgz: a call brings back at
# most 8 files (seen 2026-11-26: the ninth and later were left out).
# SIDE_BY_SIDE_DATASETS / SIDE_BY_SIDE_LENGTHS: the flags that take a process's
# dataset and length (--datasets, --lengths; the copy tasks': --copy-sources,
# --copy-lengths).
side_by_side() {
  local tag=$1 datasets=$2 lengths=$3 pids=() names=() ds len name rc=0 one shared=
  local dflag=${SIDE_BY_SIDE_DATASETS:---datasets} lflag=${SIDE_BY_SIDE_LENGTHS:---lengths}
  shift 3
  if [[ " $* " == *" $dflag "* || " $* " == *" $dflag="* ]]; then
    echo "side_by_side: name the datasets in GRID_DATASET / EVAL_DATASET, not $dflag" >&2
    return 2
  fi
  if [ -n "${lengths//[[:space:]]}" ] && [[ " $* " == *" $lflag "* || " $* " == *" $lflag="* ]]; then
    echo "side_by_side: name the lengths in GRID_LENGTH / EVAL_LENGTHS, not $lflag" >&2
    return 2
  fi
  local -a dataset_list length_list
  read -r -a dataset_list <<< "$datasets"
  read -r -a length_list <<< "$lengths"
  for ds in "${dataset_list[@]}"; do
    if [ "${#length_list[@]}" -eq 0 ]; then names+=("${tag}_$ds|$ds|")
    else for len in "${length_list[@]}"; do names+=("${tag}_${len}_$ds|$ds|$len"); done; fi
  done
  [ "${#names[@]}" -gt 0 ] || { echo "side_by_side: no datasets" >&2; return 2; }
  [ "${#names[@]}" -gt 1 ] && shared=--shared-gpu
  for one in "${names[@]}"; do
    IFS='|' read -r name ds len <<< "$one"
    timeout 575 python3 -m benchmarks.longinput.eval_longinput run "$@" $shared $dflag $ds \
      ${len:+$lflag $len} --out "$OUT/$name.json" > "$OUT/$name.log" 2>&1 &
    pids+=($!)
  done
  for one in "${pids[@]}"; do wait "$one" || rc=$?; done
  for one in "${names[@]}"; do
    name=${one%%|*}
    echo "== $name"; cat "$OUT/$name.md"
    grep -m5 -iE "error|Traceback" "$OUT/$name.log"
  done
  if [ "${#names[@]}" -gt 2 ]; then
    # What each process left: one that failed early may have no .json or .md.
    local files=() f
    for one in "${names[@]}"; do
      for f in "${one%%|*}".{json,md,log}; do [ -e "$OUT/$f" ] && files+=("$f"); done
    done
    tar -C "$OUT" -czf "$OUT/$tag.tgz" "${files[@]}"
    (cd "$OUT" && rm -f "${files[@]}")
  fi
  return $rc
}
# SmolLM2-135M-Instruct as an HF checkpoint in /root/pair/target, built once
# per machine from the GGUF the `gguf` phase brought (TAG names its log).
smollm2_target() {
  [ -d /root/pair/target ] && return 0
  PYTHONPATH=/root/vsite:/root/gguf timeout 300 python3 -c \
    "from benchmarks.models.builders import build_smollm2 as b; b('/root/pair/target')" \
    > "$OUT/$1_target.log" 2>&1 && return 0
  echo "$1: no target"; tail -5 "$OUT/$1_target.log"; return 1
}
# Configurations side by side, each a side_by_side set over OPTIONS_DATASET at
# OPTIONS_LENGTH (8192), all running at once: SmolLM2 as the target,
# prompts in 2048-token chunks (so a prompt window has earlier chunks to leave
# out), CMR at a 512-token working set, OPTIONS_ARGS last.
#   configs_side_by_side TAG "MODES" "NAME|DRAFT|PLUGIN_CONFIG_JSON"...
# Their tables go to the call's output, every file into $OUT/TAG.tgz
# (whatever a failed process left: a call brings back 8 files at most).
configs_side_by_side() {
  local tag=$1 modes=$2 one rest pids=() rc=0
  shift 2
  for one in "$@"; do
    rest=${one#*|}
    side_by_side "${tag}_${one%%|*}" "${OPTIONS_DATASET:-govreport pg19}" \
      "${OPTIONS_LENGTH:-8192}" --target /root/pair/target --draft "${rest%%|*}" \
      --modes $modes --working-sets 512 --max-num-batched-tokens 2048 \
      --spec-extend "${rest#*|}" ${OPTIONS_ARGS:-} > "$OUT/${tag}_${one%%|*}.txt" 2>&1 &
    pids+=($!)
  done
  for one in "${pids[@]}"; do wait "$one" || rc=$?; done
  cat "$OUT/${tag}"_*.txt
  (cd "$OUT" && shopt -s nullglob && files=("${tag}"_*.{json,md,log,txt,tgz}) \
    && tar -czf "$tag.tgz" "${files[@]}"; rm -f "${files[@]}")
  return $rc
}
# Engine and server flags across GPUs (issue #44), every phase's: tp_flags
# SIZE [EXECUTOR] gives SIZE > 1 GPUs with the EXECUTOR (mp) executor and
# vLLM's all-reduce + RMSNorm fusion off (these hosts keep NVLink multicast
# off: the fusion's auto-selected mnnvl all-reduce crashed CUDA-graph capture
# of an 8B at TP=2; under --spec-extend the plugin turns it off itself, a
# plain engine needs the flag); nothing at 1. Callers at SIZE > 1 also set
# VLLM_ALLREDUCE_USE_SYMM_MEM=0 (symmetric-memory all-reduce, off likewise).
# TP_FUSION=trtllm turns the fusion on with FlashInfer's trtllm backend
# (IPC buffers, no multicast: the A/B of issue #44 item 4); mnnvl is refused,
# as it calls cuMulticastCreate, which these hosts forbid (KINDS.md).
case "${TP_FUSION:-}" in
  "") ;;
  trtllm) export VLLM_FLASHINFER_ALLREDUCE_BACKEND=trtllm ;;
  *) echo "TP_FUSION: trtllm or unset (mnnvl needs NVLink multicast, off here)" >&2; exit 2 ;;
esac
tp_flags() {
  [ "${1:-1}" -gt 1 ] || return 0
  local fuse=false; [ -n "${TP_FUSION:-}" ] && fuse=true
  echo --tensor-parallel-size "$1" --distributed-executor-backend "${2:-mp}" \
    --compilation-config "{\"pass_config\":{\"fuse_allreduce_rms\":$fuse}}"
}
