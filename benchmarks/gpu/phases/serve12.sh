# host_run.sh serve12: vllm serve under load: bursts or request rates, one
# mode and workload a call.
# Feeds: issues #12, #44, #45; results/serve/<run>/
#
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
# (serve_traffic below); each rate table proposes the rate for 16 requests
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
tar -C "$OUT" -czf "$OUT/serve12_$tag.tgz" "serve12_$tag" && rm -rf "$OUT/serve12_$tag"
