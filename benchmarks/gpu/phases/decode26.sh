# host_run.sh decode26: decode speed at batch 1, 1,024 new tokens, one engine
# per call.
# Feeds: issue #26's table; results/decode/*.json (e.g. *_done-when, *_64k)
#
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
grep -m5 -E "Error|error:|SpecExtend: (draft routine|capturing)" "$OUT/decode26_$tag.log"
