# host_run.sh rate45: the rate table on a 4-GPU host: a detached serve12 a
# GPU, side by side.
# Feeds: issue #45; results/serve/*_rate*/
#
# Issue #45's rate table on a 4-GPU host: a detached serve12 a GPU, the
# modes of each one after another on it, the four GPUs side by side:
#   GPU 0: plain, spec_extend at RATE_HIGH (load high)
#   GPU 1: plain, spec_extend with RATE45_CONFIG (default: the pooled
#          prompt pass, draft_prompt_pool "auto", what it saves against the
#          full pass, the default since 2026-12-06; RATE45_TAG names it) and RATE45_DRAFT
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
config=${RATE45_CONFIG:-'{"top_k": 32, "recent_tokens": 256, "draft_prompt_pool": "auto"}'}
b1=llama32_1b
jobs=("0|plain spec_extend|$high|high|||$b1"
      "1|plain spec_extend|$high|high|$config|${RATE45_TAG:-pooled}|${RATE45_DRAFT:-$b1}"
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
exit $rc
