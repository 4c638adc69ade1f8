# host_run.sh self-draft: decode speed of the 8B drafting for itself
# (self_draft) against plain.
# Feeds: issue #11; results/decode/*_8b-self-draft.json
#
# Issue #11's speed table: the 8B shape drafting for itself (K=3 by default,
# SELF_K), synthetic acceptance 3.0, against plain; same cells and flags as
# decode15. SELF_MODES / DECODE_CONTEXTS / DECODE_BATCHES narrow a call.
modes=${SELF_MODES:-plain self_draft}; tag=$(echo $modes | tr ' ' -)
timeout ${DECODE_TIMEOUT:-570} python3 -m benchmarks.decode.bench_decode \
  --target-config $M/llama31_8b --modes $modes --num-spec-tokens ${SELF_K:-3} \
  --contexts ${DECODE_CONTEXTS:-16384 32768} --batch-sizes ${DECODE_BATCHES:-1 8} \
  --out "$OUT/self_draft_$tag.json" > "$OUT/self_draft_$tag.log" 2>&1
echo "self-draft rc=$?"; python3 -m benchmarks.decode.summarize_decode "$OUT/self_draft_$tag.json"
grep -m3 -E "Error|error:" "$OUT/self_draft_$tag.log"
