# host_run.sh prefillfloor: the floor of a long prompt's prefill: its GEMMs
# and attention alone.
# Feeds: issue #22; results/serve/*_prefill-floor_*.{json,log}
#
# Issue #22: the target's prefill of one long prompt with only its GEMMs
# and attention, back to back as vllm serve chunks it
# (prefill_floor_bench.py); torch and vLLM's FA3, no engine: 1-2 minutes.
# PREFILLFLOOR_ARGS adds or overrides flags (--model, --window, --fp8);
# PREFILLFLOOR_TAG names the files, so that several runs fit one call.
tag=${PREFILLFLOOR_TAG:-prefill_floor}
timeout 300 python3 -m benchmarks.gpu.prefill_floor_bench --model $M/llama31_8b \
  --out "$OUT/$tag.json" ${PREFILLFLOOR_ARGS:-} > "$OUT/$tag.log" 2>&1
rc=$?; grep -vE '^[ {}\[\]"]' "$OUT/$tag.log" | tail -12; echo "prefillfloor $tag rc=$rc"; exit $rc
