# host_run.sh profile26: where a step's GPU time goes (torch.profiler, one
# GPU or every rank).
# Feeds: issues #22, #26, #44, #45; results/{decode,serve,tp}/*_profile_*
#
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
rm -rf "$OUT/models"
