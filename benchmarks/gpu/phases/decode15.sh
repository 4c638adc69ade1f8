# host_run.sh decode15: the decode table: plain, draft_model and spec_extend
# over contexts and batches.
# Feeds: issue #15; results/decode/*_8b-1b.json, *_8b-68m.json
#
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
grep -m3 -E "Error|error:" "$OUT/decode15_$tag.log"
